"""Errors that reach a user as one clear line, on either side."""

from __future__ import annotations


class Oz0Error(Exception):
    """An error whose message is meant for the person at the keyboard."""


def user_error_in(group: BaseExceptionGroup[BaseException]) -> Oz0Error | None:
    """The first Oz0Error of GROUP when nothing else is in it: what a user should see."""
    matched, rest = group.split(Oz0Error)
    if matched is None or rest is not None:
        return None
    leaf: BaseException = matched
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf if isinstance(leaf, Oz0Error) else None
