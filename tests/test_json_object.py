"""Every message of ours is read as a JSON object in one place (oz0_common/json_object.py),
so the edge, the agent and an attempt's supervisor refuse the same things the same way:
what is not a JSON object, and nesting too deep for json's parser, which raises
RecursionError (not a ValueError) and would otherwise end the task reading the message."""

from __future__ import annotations

import pytest

from oz0.server.edge import common as edge_common
from oz0_common import json_object
from oz0_node import messages
from oz0_node.errors import ProtocolViolation
from oz0_node.jobs import session_handover

# Deeper than json's parser goes (about 1,000 levels).
DEEP = "[" * 100_000 + "]" * 100_000


def test_a_json_object_is_read_as_one() -> None:
    assert json_object.parse('{"type": "welcome", "n": [1]}') == {"type": "welcome", "n": [1]}
    assert json_object.parse(b'{"a": {}}') == {"a": {}}


@pytest.mark.parametrize("raw", ["", "[1]", "1", '"x"', "null", "{", b"\xff{}"])
def test_what_is_not_a_json_object_is_refused(raw: str | bytes) -> None:
    with pytest.raises(json_object.NotAnObject) as refused:
        json_object.parse(raw)
    assert not isinstance(refused.value, json_object.TooDeep)
    assert isinstance(refused.value, ValueError)


def test_nesting_too_deep_for_the_parser_is_refused_not_raised() -> None:
    with pytest.raises(json_object.TooDeep):
        json_object.parse(DEEP)


def test_each_reader_refuses_too_deep_a_message_in_its_own_words() -> None:
    with pytest.raises(ValueError, match="nested this deeply"):
        edge_common.decode(DEEP)
    with pytest.raises(ValueError, match="must be JSON objects"):
        edge_common.decode("[1]")
    with pytest.raises(ProtocolViolation, match="not a protocol message"):
        messages.decode(DEEP, "edge-a:7443")
    assert session_handover.decode(DEEP.encode()) == {}
