"""What a node may say about itself at its join: the strings operators will later read.

A node is not trusted: its hostname and labels end up in `node list`, `node show` and the
audit log, on an operator's terminal. They are checked once, at the join, so what the
cluster stores is plain text; the CLI escapes on output too (cli/output.py), for rows
written before these rules.

- hostname: empty (the node did not say), or 1-253 characters of ASCII letters, digits,
  `.`, `-` and `_`, starting with a letter or digit (what hostnames are, RFC 1123, plus
  the underscore some machines have).
- labels: at most MAX_LABELS; keys as `oz0.nodes.check_labels` says (lowercase letters,
  digits, `.`, `_`, `/`, `-`, 1-63 characters, starting and ending with a letter or
  digit); values up to 253 printable characters (no control or format characters,
  no line or paragraph separators).
"""

from __future__ import annotations

import re

from oz0 import nodes

MAX_HOSTNAME = 253
MAX_LABELS = nodes.MAX_LABELS
_HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class UntrustedString(nodes.NodeError):
    """A node sent a string the cluster will not store; the message says which and why."""


def check_hostname(value: object) -> str:
    """VALUE as the hostname to store ("" for none); UntrustedString if it breaks the rules."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str):
        raise UntrustedString("hostname must be a string")
    if len(value) > MAX_HOSTNAME or not _HOSTNAME.fullmatch(value):
        raise UntrustedString(
            f"hostname {value[:64]!a}{'...' if len(value) > 64 else ''} is not a host name:"
            f" at most {MAX_HOSTNAME} ASCII letters, digits, '.', '-' and '_', starting with a"
            " letter or digit"
        )
    return value


def check_labels(value: object) -> dict[str, str]:
    """VALUE as the labels to store ({} for none); UntrustedString if it breaks the rules."""
    if value is None:
        return {}
    try:
        return nodes.check_labels(value)
    except nodes.NodeError as e:  # its message shows keys by repr: control characters escaped
        raise UntrustedString(str(e)) from None


def check_join(message: dict[str, object]) -> tuple[str, dict[str, str]]:
    """The hostname and labels of a join message, checked."""
    return check_hostname(message.get("hostname")), check_labels(message.get("labels"))
