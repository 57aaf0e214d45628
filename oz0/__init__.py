"""orchestrator-zero server."""

from oz0_common import __version__ as __version__
