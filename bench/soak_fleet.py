"""The soak's fleet (issue 44): N real agents (fixtures/agent.py), agent i given edge
i % 3 first and the label soak-group=i % 5, agent 0's data directory on a small tmpfs of
its own (the disk that fills), the last min(4, N/4) in network namespaces of their own
(bench/soak_netns.py: the nodes whose network is cut); started, rejoined after a purge,
and stopped (paused ones woken first).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.runner import Bench, create_token, log, wait_until
from bench.soak_netns import Namespace, namespaces
from bench.soak_state import ADDRESSES, EDGES, NAMESPACES, Failed
from bench.soak_workload import GROUP_LABEL, GROUPS
from fixtures.agent import AgentProcess, stop_all

AGENTS_UP_TIMEOUT = 300.0
DISK_MIB = 24


@dataclass(eq=False)
class Agent:
    """One agent slot: the agent running now (a purge gives the slot a new one)."""

    index: int
    data_dir: Path
    process: AgentProcess
    node_id: str = ""
    # A fault or an action holds it: nothing else is done to it meanwhile.
    busy: str | None = None
    # Purged and not yet joined again: no fault, no action.
    gone: bool = False
    generation: int = 0
    # Its network namespace, if it runs in one (soak_netns.py).
    namespace: Namespace | None = None

    def start(self, process: AgentProcess) -> None:
        if self.namespace is not None:
            process.prefix = self.namespace.prefix
        self.process = process.start()


@dataclass(eq=False)
class Fleet:
    bench: Bench
    agents: list[Agent] = field(default_factory=list)
    token: str = ""
    # The tmpfs agent 0's data directory is on.
    disk_mount: Path | None = None

    def start(self, count: int) -> None:
        log(f"starting {count} agents")
        self.token = create_token(self.bench.files, "bench.soak")
        base = self.bench.root / "agents"
        base.mkdir()
        # The last few agents in network namespaces of their own (the nodes cut off).
        held = min(len(NAMESPACES), count // 4)
        spaces = self.bench.cleanups.enter_context(namespaces(NAMESPACES[:held], ADDRESSES))
        in_space = dict(zip(range(count - held, count), spaces, strict=True))
        for i in range(count):
            data_dir = base / f"node-{i}"
            if i == 0:
                # The agent whose disk fills: its data directory on a small tmpfs.
                mount = base / "oz0soak-disk"
                mount.mkdir()
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m,mode=0700", "tmpfs",
                     str(mount)], check=True, capture_output=True,
                )  # fmt: skip
                self.disk_mount = mount
                self.bench.cleanups.callback(
                    subprocess.run, ["umount", "-l", str(mount)], capture_output=True
                )
                data_dir = mount / "node"
            slot = Agent(i, data_dir, self.joining(i, data_dir), namespace=in_space.get(i))
            self.agents.append(slot)
            slot.start(slot.process)
        # Last in, first out: the agents stop before the tmpfs goes.
        self.bench.cleanups.callback(self.stop)
        deadline = time.monotonic() + AGENTS_UP_TIMEOUT
        while True:
            up = [a for a in self.agents if connected(a.process)]
            if len(up) == len(self.agents):
                break
            if time.monotonic() > deadline:
                dead = [a for a in self.agents if a not in up]
                raise Failed(
                    f"only {len(up)} of {count} agents connected:\n{dead[0].process.log()[-1500:]}"
                )
            time.sleep(0.5)
        for slot in self.agents:
            slot.node_id = str(slot.process.reported()["node_id"])

    def joining(self, i: int, data_dir: Path) -> AgentProcess:
        return AgentProcess.joining(
            data_dir, EDGES[i % 3 :] + EDGES[: i % 3], self.bench.files.ca_hash,
            token=self.token, labels=group_of(i),
        )  # fmt: skip

    async def rejoin(self, agent: Agent) -> None:
        """A purged agent's slot given a new agent, joined with a new data directory."""
        agent.generation += 1
        agent.data_dir = agent.data_dir.with_name(f"node-{agent.index}-{agent.generation}")
        agent.start(self.joining(agent.index, agent.data_dir))
        if await wait_until(lambda: connected(agent.process), 120):
            agent.node_id = str(agent.process.reported()["node_id"])
            agent.gone = False

    def stop(self) -> None:
        for agent in self.agents:
            with contextlib.suppress(ProcessLookupError, AttributeError):
                if agent.process.process is not None:
                    os.kill(agent.process.process.pid, signal.SIGCONT)
        stop_all([a.process for a in self.agents])

    def free_agent(self, rng: random.Random) -> Agent | None:
        """An agent nothing holds, connected, not agent 0 (its disk fills)."""
        free = [a for a in self.agents[1:] if a.busy is None and not a.gone]
        rng.shuffle(free)
        return next((a for a in free if connected(a.process)), None)


def group_of(index: int) -> dict[str, str]:
    return {GROUP_LABEL: str(index % GROUPS)}


def connected(agent: AgentProcess) -> bool:
    reported = agent.reported()
    return agent.running() and reported.get("connected") is True and "node_id" in reported
