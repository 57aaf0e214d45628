"""What the servers and the node agent share (the agent carries only this of the project):
errors, secret files, certificate naming, command running, the version, the purge
command's format.

Its modules:

- `addresses.py`: the cluster's well-known ports, and a host as written in an address or a
  URL.
- `asyncio_portal.py`: the one bridge between Trio and asyncio (temporalio is
  asyncio-only), both ways: into an asyncio loop after anyio's `start_blocking_portal`,
  back into the Trio run after `trio.from_thread`.
- `attempt_grant.py`: the attempt grant's format, which the server that places an attempt
  signs and the node checks before it runs anything (docs/node-protocol.md, "Signed
  attempts").
- `attempt_heartbeat.py`: what every heartbeat of a node's attempt activity carries
  (`oz0.job.attempt`).
- `attempt_messages.py`: the attempt messages of the control stream, typed once for both
  ends (docs/node-protocol.md, "Jobs" and "Attempts over the stream"): the edge builds what
  the node parses.
- `certs.py`: certificates as both sides see them: keys and PEM, who a certificate names (CN
  the holder, OU its role, O the cluster), the CA hash nodes pin, renewal points, requests.
- `commands.py`: what the `orchestrator-zero` and `oz0-node` processes share: how a command
  ends, and a root nursery that SIGINT/SIGTERM stop.
- `datadir.py`: where a node agent keeps everything it has: the one rule, for the agent and
  whatever starts it (the one-file bootstrap unpacks its Python into the same directory).
- `errors.py`: errors that reach a user as one clear line, on either side.
- `file_push.py`: a file push's part as the cluster signs it and the node runs it
  (docs/files.md).
- `files.py`: files holding secrets: written whole or not at all, 0600 from their first
  byte.
- `json_object.py`: a JSON object another process sent (node, edge, supervisor), read the
  one way every message of ours is, nesting too deep for the parser refused, not raised.
- `purge_format.py`: the purge command's format, which the server signs and the node checks
  (docs/node-protocol.md, "Purge"): a canonical JSON object, signed with the cluster CA's
  key (ECDSA P-256, SHA-256).
- `sealed_env.py`: a job's secret environment, encrypted to the one node that runs one
  attempt.
- `session_messages.py`: the session messages, typed once for the three ends that speak them
  (docs/sessions.md): the CLI and the management API (a websocket on 8443), the edge and the
  node (the node's control stream).
- `strict_modes.py`: strict modes, as sshd's StrictModes: what a node runs of its own accord
  (a plugin, a tool, the unpacked Python) is owned by the agent's user or root and writable
  by nobody else.
- `temporal_tls.py`: a Temporal client's mutual TLS (the cluster CA, then the certificate
  and key it presents), from PEM in memory or the files of an identity (a node's data
  directory, an operator's context).
- `unit_files.py`: installing a systemd unit file (`oz0-node install-service`, `server
  install-service`).
- `waits.py`: waiting on Trio for the first of several things (the job follower's news or a
  stop, the audit stream's commits, keep-alive or a person's change).
"""

__version__ = "0.1.0"
