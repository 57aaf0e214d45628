"""Where `oz0-node start` takes a join token from: a private file or the environment.

Never the command line: every user of the machine can read a process's arguments (`ps`,
/proc/PID/cmdline), while a 0600 file and a process's environment are its owner's only.
`--token` is still recognised, but only to refuse it with what to do instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from oz0_common import certs
from oz0_node.errors import AgentError

ENV_VAR = "OZ0_JOIN_TOKEN"
# Tokens are about 60 characters; anything much longer is not a token file.
MAX_TOKEN_FILE_BYTES = 4096


def read(token_file: Path | None, token_argument: str | None) -> str | None:
    """The join token, from --token-file or OZ0_JOIN_TOKEN (not both); None when neither.

    OZ0_JOIN_TOKEN is removed from this process's environment once read, so nothing the
    agent starts inherits it.
    """
    if token_argument is not None:
        raise AgentError(
            "--token would put the join token on the command line, where every user of this "
            f"machine can read it: write it to a file only you can read (chmod 600) and give "
            f"--token-file PATH, or set {ENV_VAR}; revoke a token already shown this way "
            "(orchestrator-zero token revoke ID)"
        )
    from_env = os.environ.pop(ENV_VAR, None)
    if token_file is not None and from_env is not None:
        raise AgentError(f"give the join token once: --token-file or {ENV_VAR}, not both")
    if token_file is not None:
        path = token_file.expanduser().absolute()
        raw = certs.read_private(path, "join token file", AgentError, MAX_TOKEN_FILE_BYTES + 1)
        if len(raw) > MAX_TOKEN_FILE_BYTES:
            raise AgentError(f"join token file {path} is not a join token (too long)")
        try:
            token = raw.decode("ascii").strip()
        except UnicodeDecodeError:
            raise AgentError(f"join token file {path} is not a join token (not ASCII)") from None
        if not token or any(c.isspace() for c in token):
            raise AgentError(f"join token file {path} must hold one join token and nothing else")
        return token
    if from_env is not None:
        token = from_env.strip()
        if not token:
            raise AgentError(f"{ENV_VAR} is set but empty")
        return token
    return None
