"""A form's text fields as a JSON body would hold them, for the pages that hand a form to
the same checks as the API (TokenSpec.from_json, JobSpec.from_json)."""

from __future__ import annotations


def form_lines(text: str) -> list[str]:
    """The non-blank lines of a textarea, stripped (KEY=VALUE lines)."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def whole_number(text: str) -> int | str:
    """A number field as the JSON body would have it; TEXT as it is when it is not one, for
    the spec's own check to refuse with its message."""
    try:
        return int(text.strip())
    except ValueError:
        return text
