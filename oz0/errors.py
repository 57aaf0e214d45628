"""Errors that reach a user as one clear line."""


class Oz0Error(Exception):
    """An error whose message is meant for the person at the keyboard."""


class MasterKeyError(Oz0Error):
    """The master key file is missing, unreadable, malformed or too open."""


class WrongMasterKey(Oz0Error):
    """The master key does not unseal this cluster's CAs."""


class SchemaMismatch(Oz0Error):
    """The database schema is not the version this code expects."""


def user_error_in(group: BaseExceptionGroup[BaseException]) -> Oz0Error | None:
    """The first Oz0Error of GROUP when nothing else is in it: what a user should see."""
    matched, rest = group.split(Oz0Error)
    if matched is None or rest is not None:
        return None
    leaf: BaseException = matched
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf if isinstance(leaf, Oz0Error) else None
