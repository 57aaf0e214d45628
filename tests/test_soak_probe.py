"""The soak's Temporal probe (bench/soak_probe.py) against a server that is down: it says
the server was unreachable and goes on asking, and never raises (the hour-long soak at
45841ec ended at minute 12 on a probe's "Failed client connect" while a Temporal host was
down). Binds nothing: 127.0.0.218 is the address nothing listens on (tests/test_metrics.py)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from bench.soak_probe import TemporalProbe
from oz0_node.identity import IdentityDir

DOWN = "127.0.0.218"


def test_a_server_that_is_down_is_unreachable_not_the_end_of_the_soak(tmp_path: Path) -> None:
    identity = IdentityDir(tmp_path)
    identity.key_path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-subj", "/CN=soak-probe", "-days", "1",
         "-keyout", str(identity.key_path), "-out", str(identity.cert_path)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    identity.ca_path.write_bytes(identity.cert_path.read_bytes())
    probe = TemporalProbe(tmp_path, "default", (DOWN,))
    began = time.monotonic()
    probe.run(time.time() + 1.0)
    assert probe.failed is None, probe.failed
    assert probe.unreachable == {DOWN}
    assert probe.refused == {}
    assert time.monotonic() - began < 10.0, "it asked until its end, each call bounded"
