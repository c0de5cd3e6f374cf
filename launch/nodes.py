"""The coordinator's view of the other nodes: each node's agent joins (launch/agent.py), is told
its ranks and the launch's options, beats every half second and reports a rank of its that ended
unasked. A node whose agent goes silent for AGENT_TIMEOUT_S, or that reports a failed rank, ends
the launch, named; at the end every agent is told to stop, and takes its ranks down itself."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from radiance.config import Config
from radiance.log import get_logger
from radiance.ranks.layout import Layout

from .supervisor import RankFailed

log = get_logger("radiance.launch")
# An agent beats every 0.5 s: six missed beats end the launch, so a dead node is named within 10 s
# of its death (3 s, then the teardown).
AGENT_TIMEOUT_S = 3.0
AGENT_KINDS = ("join", "node-beat", "node-failed")


class NodeFailed(RuntimeError):
    """A node ended the launch: which one, its ranks, and how."""


@dataclass
class Joined:
    node: int
    route: bytes
    pid: int
    address: str
    beat: float


class Nodes:
    def __init__(self, config: Config, send: Callable[[bytes, str, dict], None]):
        self.config, self.layout, self.send = config, Layout.of(config), send
        self.joined: dict[int, Joined] = {}
        self.node_of: dict[bytes, int] = {}

    def remote(self, rank: int) -> bool:
        return self.layout.node(rank) != 0

    def describe(self, node: int) -> str:
        ranks = self.layout.ranks_of(node)
        joined = self.joined.get(node)
        where = f", agent pid {joined.pid} at {joined.address}" if joined else ""
        return f"node {node} (ranks {ranks[0]}-{ranks[-1]}{where})"

    def take(self, route: bytes, kind: str, meta: dict) -> bool:
        """Handle an agent's message; False for anyone else's."""
        if kind not in AGENT_KINDS:
            return False
        if kind == "join":
            node = meta.get("node")
            if not isinstance(node, int) or not 0 < node < self.layout.nnodes:
                raise NodeFailed(f"a node joined as node {node!r}: the launch has nodes 1 to {self.layout.nnodes - 1} "
                                 "besides this one (check --node-rank and --nnodes)")
            if node in self.joined:
                raise NodeFailed(f"node {node} joined twice (two nodes were given --node-rank {node})")
            self.joined[node] = Joined(node, route, int(meta.get("pid", 0)), str(meta.get("address", "?")),
                                       time.monotonic())
            self.node_of[route] = node
            self.send(route, "assign", {"config": dataclasses.asdict(self.config)})
            log.info("%s joined", self.describe(node))
            return True
        node = self.node_of.get(route)
        if node is None:
            raise NodeFailed(f"a signed '{kind}' message from a node that never joined")
        if kind == "node-beat":
            self.joined[node].beat = time.monotonic()
            return True
        raise RankFailed(None, f"{meta.get('how', 'failed')} (reported by its node's agent)", rank=meta.get("rank"),
                         node=node, tail=meta.get("tail"))

    def check(self) -> None:
        """A node whose agent has gone silent ends the launch (after every queued message was taken)."""
        now = time.monotonic()
        for node, joined in self.joined.items():
            if now - joined.beat > AGENT_TIMEOUT_S:
                raise NodeFailed(f"{self.describe(node)} failed first: its agent is gone "
                                 f"(no word from it for {now - joined.beat:.1f} s)")

    def stop(self, failed: bool) -> None:
        for joined in self.joined.values():
            self.send(joined.route, "stop", {"failed": failed})
