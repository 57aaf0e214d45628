"""The two ends of a control stream handle what the other sends: every type the node sends
has a handler in the edge's table (oz0.server.edge.control.HANDLERS) and the table has
none the node never sends; every type the edge sends on a live stream has one in the
node's (oz0_node.commands.HANDLERS). A type without a handler is ignored, silently on the
edge, so a message added on one side and forgotten on the other fails here, not in the
field.

What each side sends is read from its source, as tests/test_layers.py reads imports: the
calls that send a message (`conn.send(KIND, ...)`, `link.send(KIND, ...)`,
`link.exchange(KIND, ...)` on the node; `send(ws, KIND, ...)`, `_say(KIND, ...)` and
`{"type": KIND}` on the edge), KIND a string or a module's constant.
"""

from __future__ import annotations

import ast
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from fixtures.syntax_trees import parsed
from oz0.server.edge import control
from oz0.server.edge.heartbeats import HEARTBEATS
from oz0_node import commands

ROOT = Path(__file__).resolve().parent.parent
# The /join stream's, not the control stream's.
NOT_CONTROL = {"join.py"}
# What the node reads itself, outside its handlers: before the live stream (the `hello`
# and the `welcome`, oz0_node/control.py) and after a purge passed (`forgotten`,
# commands._await_forgotten).
READ_OUTSIDE_HANDLERS = {"hello", "welcome", "forgotten"}


Sends = Callable[[ast.AST], list[ast.expr]]


def _module(path: Path) -> ModuleType:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))


def _kind(path: Path, node: ast.expr) -> str | None:
    """The message type NODE names: a string, or a string constant of PATH's module; None
    for anything else (a variable, as in a helper that sends what it is given)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        value = getattr(_module(path), node.id, None)
        return value if isinstance(value, str) else None
    return None


def _receiver(func: ast.Attribute) -> str | None:
    """`conn` for `conn.send`, `self.manager.link.send` and `stream.conn.send` alike."""
    value = func.value
    if isinstance(value, ast.Name):
        return value.id
    if isinstance(value, ast.Attribute):
        return value.attr
    return None


def _sent(package: str, sends: Sends) -> set[str]:
    kinds: set[str] = set()
    for path in sorted((ROOT / package).rglob("*.py")):
        if path.name in NOT_CONTROL:
            continue
        for node in ast.walk(parsed(path)):
            for arg in sends(node):
                kind = _kind(path, arg)
                if kind is not None:
                    kinds.add(kind)
    return kinds


def _node_sends(node: ast.AST) -> list[ast.expr]:
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("send", "exchange")
        and _receiver(node.func) in ("conn", "link")
        and node.args
    ):
        return [node.args[0]]
    return []


def _edge_sends(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "send" and len(node.args) >= 2:
            return [node.args[1]]
        if isinstance(func, ast.Attribute) and func.attr == "_say" and node.args:
            return [node.args[0]]
    if isinstance(node, ast.Dict):
        return [
            value
            for key, value in zip(node.keys, node.values, strict=True)
            if isinstance(key, ast.Constant) and key.value == "type"
        ]
    return []


def test_the_scan_finds_what_each_side_sends() -> None:
    """The scans below see the sends they are meant to (a scan finding nothing passes)."""
    node = _sent("oz0_node", _node_sends)
    assert {"heartbeat", "renew", "purged", "attempt_done", "attempt_taken"} <= node
    edge = _sent("oz0/server/edge", _edge_sends)
    assert {"welcome", "move", "edges", "renewed", "attempt", "attempt_stop"} <= edge


def test_the_edge_handles_every_type_the_node_sends_and_no_other() -> None:
    node = _sent("oz0_node", _node_sends)
    # Heartbeats are signs of life only, taken before any decoding (ControlStream._receive).
    assert {json.loads(raw)["type"] for raw in HEARTBEATS} == {"heartbeat"}
    assert set(control.HANDLERS) == node - {"heartbeat"}


def test_the_node_handles_every_type_the_edge_sends_on_a_live_stream() -> None:
    edge = _sent("oz0/server/edge", _edge_sends)
    assert edge - READ_OUTSIDE_HANDLERS - set(commands.HANDLERS) == set()
