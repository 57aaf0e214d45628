"""The node agent, `oz0-node`.

Its modules:

- `addresses.py`: edge addresses: `HOST:PORT` (IPv6 as `[ADDR]:PORT`), as the CLI and the
  edge spell them.
- `agent.py`: `oz0-node start`: from what DIR remembers (or the command line), join and stay
  connected.
- `commands.py`: what the agent does with each message the edge sends on a live control
  stream.
- `control.py`: the control stream: one websocket to `/control` at a time, kept up for as
  long as we run.
- `errors.py`: what can go wrong in the agent, split by what the agent does about it.
- `identity.py`: the node's identity on disk: DIR/identity/ (0700).
- `jobs/`: jobs on the node: the `oz0.job.attempt` activity, the attempts' supervisors, and
  the manager that follows them across control streams and agent restarts.
- `join.py`: joining a cluster: pin its CA, ask for a certificate, and wait for it while
  pending.
- `join_token.py`: where `oz0-node start` takes a join token from: a private file or the
  environment.
- `layout.py`: what a node's data directory DIR holds (docs/manage-nodes.md, "The data
  directory").
- `main.py`: `oz0-node`: the agent a node machine runs.
- `messages.py`: the node protocol's messages (docs/node-protocol.md), decoded and checked.
- `node.py`: what the agent knows about itself while it runs, kept on disk as it changes.
- `plugins.py`: plugins: the executables in DIR/plugins/, run by the agent alongside its
  runtime.
- `purge.py`: purge: check a signed purge command, remember its nonce, and delete the node's
  files.
- `reconnect.py`: when and where to try next: exponential backoff with full jitter across
  every known edge.
- `renewal.py`: keeping the node certificate valid: renewed over the control stream before
  it expires.
- `runtime.py`: the node's runtime: a Temporal worker on the node's own task queue, named
  its node ID.
- `service.py`: `oz0-node install-service`: the systemd unit that runs the agent
  (docs/manage-nodes.md, "Run the agent under systemd").
- `sessions.py`: interactive sessions on this node (docs/sessions.md): a command on a PTY,
  or with pipes, carried over the control stream, isolated exactly as an attempt is.
- `status.py`: DIR/status.json: what the running agent reports about itself, for `oz0-node
  status`.
- `tls.py`: TLS towards edges..
- `transport.py`: one websocket to one edge: TCP, TLS, the websocket handshake, then JSON
  messages.
"""
