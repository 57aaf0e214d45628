"""Parameter types shared by every command group."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

# A flag with no --no- form.
Flag = Annotated[bool, Parameter(negative=())]
JsonFlag = Annotated[bool, Parameter(name="--json", negative=(), help="Print JSON for scripts.")]
ContextPath = Annotated[
    Path | None,
    Parameter(
        name="--context",
        help="context.json of the cluster to use (else $OZ0_CONTEXT, else the only one).",
    ),
]
