"""Network namespaces for the soak's agents whose network it cuts (issue 44).

Each namespace `oz0soak-K` holds one end of a veth pair (`oz0soak-nK`, 10.244.K.2/30); the
other (`oz0soak-hK`, 10.244.K.1/30) stays on the machine. The servers listen on loopback
addresses (127.0.0.44-.46), which a namespace would take for its own: there, 127.0.0.0/8
is local only as 127.0.0.1, the servers' addresses are routed through the veth, and both
ends set `route_localnet` (loopback addresses are not martians on them), so the machine
takes the packets to its own loopback and answers them through the veth. Nothing outside
the namespace and its veth changes. A cut is on the machine's end: the link down; or a
token bucket (`tc ... tbf`; this machine's kernel has no `netem` and no drop action) that
lets 1 kbit/s through with a queue of one packet, so nearly every packet is lost
(`loss`); or 64 kbit/s with half a second of queue, a crawling link (`slow`).

Root only. Every namespace is removed at the end (with its veth pair), also on failure.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

PREFIX = "oz0soak-"
CUTS = ("link_down", "loss", "slow")


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=30)


def _quiet(*command: str) -> None:
    subprocess.run(command, capture_output=True, timeout=30)


@dataclass(frozen=True)
class Namespace:
    number: int

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.number}"

    @property
    def host_end(self) -> str:
        return f"{PREFIX}h{self.number}"

    @property
    def prefix(self) -> tuple[str, ...]:
        """What runs a command inside it."""
        return ("ip", "netns", "exec", self.name)

    def cut(self, how: str) -> None:
        if how == "link_down":
            _run("ip", "link", "set", self.host_end, "down")
        elif how == "loss":
            _run("tc", "qdisc", "add", "dev", self.host_end, "root", "tbf", "rate", "1kbit",
                 "burst", "1600", "limit", "1600")  # fmt: skip
        elif how == "slow":
            _run("tc", "qdisc", "add", "dev", self.host_end, "root", "tbf", "rate", "64kbit",
                 "burst", "1600", "latency", "500ms")  # fmt: skip
        else:
            raise ValueError(f"no cut {how!r}")

    def mend(self) -> None:
        _quiet("tc", "qdisc", "del", "dev", self.host_end, "root")
        _run("ip", "link", "set", self.host_end, "up")


def remove(number: int) -> None:
    """The namespace and its veth pair, whatever is left of them."""
    _quiet("ip", "netns", "del", f"{PREFIX}{number}")
    _quiet("ip", "link", "del", f"{PREFIX}h{number}")


def make(number: int, servers: Sequence[str]) -> Namespace:
    remove(number)
    made = Namespace(number)
    inside, host = f"{PREFIX}n{number}", made.host_end
    _run("ip", "netns", "add", made.name)
    _run("ip", "link", "add", host, "type", "veth", "peer", "name", inside)
    _run("ip", "link", "set", inside, "netns", made.name)
    _run("ip", "addr", "add", f"10.244.{number}.1/30", "dev", host)
    _run("sysctl", "-qw", f"net.ipv4.conf.{host}.route_localnet=1")
    _run("ip", "link", "set", host, "up")
    steps = [
        "ip link set lo up",
        f"ip addr add 10.244.{number}.2/30 dev {inside}",
        f"ip link set {inside} up",
        f"sysctl -qw net.ipv4.conf.{inside}.route_localnet=1",
        "sysctl -qw net.ipv4.conf.all.route_localnet=1",
        # 127.0.0.1 keeps the local route of its own address (`local 127.0.0.1 dev lo`).
        "ip route del local 127.0.0.0/8 dev lo table local",
        *(
            f"ip route add {s}/32 via 10.244.{number}.1 dev {inside} src 10.244.{number}.2"
            for s in servers
        ),
    ]
    for step in steps:
        _run(*made.prefix, *step.split())
    return made


@contextlib.contextmanager
def namespaces(numbers: Sequence[int], servers: Sequence[str]) -> Iterator[list[Namespace]]:
    """A namespace for each of NUMBERS reaching SERVERS, removed afterwards."""
    made: list[Namespace] = []
    try:
        for number in numbers:
            made.append(make(number, servers))
        yield made
    finally:
        for number in numbers:
            remove(number)
