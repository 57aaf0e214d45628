"""Errors that reach a user as one clear line."""


class Oz0Error(Exception):
    """An error whose message is meant for the person at the keyboard."""


class MasterKeyError(Oz0Error):
    """The master key file is missing, unreadable, malformed or too open."""


class WrongMasterKey(Oz0Error):
    """The master key does not unseal this cluster's CAs."""


class SchemaMismatch(Oz0Error):
    """The database schema is not the version this code expects."""
