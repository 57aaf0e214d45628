"""Errors that reach a user as one clear line: the server's own, besides the shared ones."""

from oz0_common.errors import Oz0Error as Oz0Error
from oz0_common.errors import user_error_in as user_error_in


class MasterKeyError(Oz0Error):
    """The master key file is missing, unreadable, malformed or too open."""


class WrongMasterKey(Oz0Error):
    """The master key does not unseal this cluster's CAs."""


class SchemaMismatch(Oz0Error):
    """The database schema is not the version this code expects."""
