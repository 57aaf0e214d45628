"""The edge role on 7443: joins and control streams of nodes (docs/node-protocol.md).

TLS with a certificate from the cluster CA. Joining nodes have no certificate yet and
nodes with one open control streams on the same port, so client certificates are
optional at the handshake and required by `/control`.

- `listener`: TLS, the websocket upgrade and the greeting; one task per connection; the
  drain at a server's stop.
- `join`: `/join`, joining and picking a certificate up.
- `join_batch`: joins with a token, written many to a transaction.
- `join_refusals`: refused joins in the audit log, at a bounded rate.
- `attempt_refusals`: job attempts nodes refused to run, in the audit log, at a bounded
  rate per node.
- `control`: `/control`, the node's stream while it is accepted.
- `purge`: the signed purge command on a control stream.
- `renew`: a node's new certificate, asked for on its control stream.
- `directory`: the edges of the servers that are up, as told to nodes.
- `tracking`: what the edge records about its streams, and the reconcile loop.

Also here:

- `attempts.py`: the edge's side of attempts that outlive their node's control stream (issue
  30).
- `attempt_calls.py`: the Temporal calls of attempts.py (heartbeat, complete, fail, report
  cancelled), made on the jobs role's asyncio loop.
- `common.py`: what every part of the edge shares: its state and how messages are sent and
  read.
- `deliveries.py`: the streamed attempts (oz0/jobs/parts.py) of one control stream's node:
  sent to it, and what it says it did with each (docs/node-protocol.md, "Attempts over the
  stream").
- `file_serve.py`: the edge's side of a file push (oz0_common/file_push.py, docs/files.md):
  a node's `file_get` answered with a piece of the blob, read from the database (or from
  what this server kept of it).
- `handshake_turns.py`: turns at the Trio thread for TLS handshakes, oldest connection
  first, so a crowd of them cannot stall the edge nor each other.
- `heartbeats.py`: one task for every control stream's heartbeats and silences
  (docs/node-protocol.md).
- `job_output.py`: the edge's side of a job's output: `job_output` from a node, stored,
  answered.
- `metrics.py`: what the edge counts for `/metrics`: joins, refused joins, how fast removed
  nodes' streams end.
- `output_writes.py`: jobs' output as nodes send it (`job_output`: one chunk, OutputChunk,
  as both its parse and its write read it), written in batches: the chunks that arrive
  together, of many nodes' attempts.
- `part_ends.py`: the ends of streamed parts (oz0/jobs/parts.py) as nodes report them to
  this edge: written in batches, then told to their jobs' workflows, one signal per job for
  all of its parts that ended together.
- `summaries.py`: the interval loop of the edge's bounded audit trails (join_refusals.py,
  attempt_refusals.py): what went over budget in an interval is written as a summary at its
  end, and once more when the edge stops.
- `wire.py`: one edge connection on its own socket: TLS through memory BIOs, websocket
  frames by wsproto.
"""

from oz0.server.edge.common import TLS_TICKETS, Edge
from oz0.server.edge.directory import EDGE_PORT, edge_address
from oz0.server.edge.listener import drain, run

__all__ = ["EDGE_PORT", "TLS_TICKETS", "Edge", "drain", "edge_address", "run"]
