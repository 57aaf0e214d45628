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
"""

from oz0.server.edge.common import TLS_TICKETS, Edge
from oz0.server.edge.directory import EDGE_PORT, edge_address
from oz0.server.edge.listener import drain, run

__all__ = ["EDGE_PORT", "TLS_TICKETS", "Edge", "drain", "edge_address", "run"]
