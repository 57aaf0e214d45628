"""What can go wrong in the agent, split by what the agent does about it.

`AgentError` ends the agent with one line for the person at the keyboard. `EdgeUnavailable`
is about one edge at one moment (unreachable, wrong certificate, silent, closed): the
reconnect policy moves on to the next edge.
"""

from __future__ import annotations

from oz0_common.errors import Oz0Error


class AgentError(Oz0Error):
    """The agent cannot go on; the message says why, in one line."""


class EdgeUnavailable(Exception):
    """This edge could not be used just now; another attempt may succeed."""


class EdgeLeaving(EdgeUnavailable):
    """The edge's server is stopping and told us to move: another edge, at once (one of
    TOWARDS, the edges it named as up, if any)."""

    def __init__(self, message: str, towards: list[str]) -> None:
        super().__init__(message)
        self.towards = towards


class EdgeSilent(EdgeUnavailable):
    """The edge sent nothing for longer than the protocol allows."""


class ProtocolViolation(EdgeUnavailable):
    """The edge sent something the protocol does not allow here."""


def one_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The exception that matters in what a nursery raised, or GROUP itself.

    Nurseries inside the agent wrap even a single failure in a group; callers want the
    typed error. A fatal error wins over an edge failure (both can happen when one task
    fails and a sibling's stream breaks with it); anything else stays a group.
    """
    leaves = _leaves(group)
    if len(leaves) == 1:
        return leaves[0]
    if not all(isinstance(leaf, AgentError | EdgeUnavailable) for leaf in leaves):
        return group
    fatal = [leaf for leaf in leaves if isinstance(leaf, AgentError)]
    return (fatal or leaves)[0]


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found.extend(_leaves(exc))
        else:
            found.append(exc)
    return found
