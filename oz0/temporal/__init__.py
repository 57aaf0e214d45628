"""The Temporal role: our Go host embedding Temporal's server, supervised by the server."""
