"""What the servers and the node agent share (the agent carries only this of the project):
errors, secret files, certificate naming, command running, the version, the purge
command's format."""

__version__ = "0.1.0"
