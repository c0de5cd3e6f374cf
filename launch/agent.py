"""The node agent: `radiance-launch` on every node but node 0. It joins node 0's coordinator over
zmq (TCP, CURVE, every message signed), is told which ranks are its own and the launch's options,
spawns them as node 0 spawns its own, and supervises them: a rank of its that ends unasked is
reported to the coordinator (which rank, how, its last lines) and ends the node's part; the
coordinator's word (stop) or its going (the connection drops: zmq's own heartbeats notice a
silent peer) ends it too. Whatever the end, it takes its ranks down (polite, SIGTERM, SIGKILL) and
leaves nothing: its run folder and its ranks' shared memory go.

The ranks talk to the coordinator themselves (handshake, heartbeats, plans, results: wire_steps.py);
the agent only places and watches them, as torchrun's agent does its workers."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time

import zmq

from radiance.collectives.curve import LaunchKeys, client
from radiance.collectives.shm import unlink_run
from radiance.collectives.wire import Wire
from radiance.config import Config
from radiance.log import get_logger
from radiance.ranks.layout import Layout

from .placement import address_towards, resolve_address
from .run_folder import RunFolder
from .spawn import spawn_rank
from .supervisor import RankFailed, Supervisor

log = get_logger("radiance.agent")
BEAT_SECONDS = 0.5
# zmq's own heartbeats on the connection to the coordinator: a silent coordinator (its host gone
# without closing the connection) is noticed within ZMTP_TIMEOUT_MS.
ZMTP_INTERVAL_MS, ZMTP_TIMEOUT_MS = 500, 3000


def recv_monitor_message(socket: zmq.Socket) -> dict:
    """pyzmq's, imported at the first event, not with this module: zmq.utils.monitor imports
    zmq.asyncio (asyncio: 0.15 s of every process that imports the launcher)."""
    from zmq.utils.monitor import recv_monitor_message as receive

    return receive(socket)


class AgentError(RuntimeError):
    """The node's part of the launch cannot go on: one line saying why."""


def coordinator_endpoint(config: Config) -> str:
    return f"tcp://{resolve_address(config.master_addr)}:{config.master_port}"


class Agent:
    def __init__(self, config: Config):
        self.config, self.node = config, config.node_rank
        self.keys = LaunchKeys.read(config.keys, wait_s=config.stage_timeout)
        self.endpoint = coordinator_endpoint(config)
        self.address = address_towards(resolve_address(config.master_addr), config.master_port)
        self.folder = RunFolder(self.keys.signing)
        self.context = zmq.Context()
        socket = client(self.context.socket(zmq.DEALER), self.keys)
        socket.setsockopt(zmq.LINGER, 1000)
        socket.setsockopt(zmq.HEARTBEAT_IVL, ZMTP_INTERVAL_MS)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, ZMTP_TIMEOUT_MS)
        self.monitor = socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        socket.connect(self.endpoint)
        self.wire = Wire(socket, self.keys.signing)
        self.connected = False
        self.ranks, self.supervisor = [], Supervisor([])
        self.stopping = threading.Event()

    def run(self) -> int:
        """The node's part, start to end; 0 when the launch ended as asked."""
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        signal.signal(signal.SIGINT, lambda *_: self.stopping.set())
        try:
            self.wire.send("join", {"node": self.node, "pid": os.getpid(), "address": self.address})
            assignment = self._await("assign", self.config.stage_timeout)
            self._spawn(assignment)
            return self._watch()
        except RankFailed as failed:  # told to the coordinator, which ends the launch naming it
            self.wire.send("node-failed", {"node": self.node, "rank": failed.rank, "how": failed.how,
                                           "tail": list(failed.tail)})
            raise
        finally:
            self._teardown()

    def _events(self) -> None:
        """The connection's comings and goings; gone once connected: the coordinator is."""
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_CONNECTED:
                self.connected = True
            elif event == zmq.EVENT_DISCONNECTED and self.connected:
                raise AgentError(f"node {self.node}: the coordinator at {self.endpoint} is gone")

    def _await(self, kind: str, seconds: float) -> dict:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.stopping.is_set():
            self._events()
            message = self.wire.recv(timeout_ms=100)
            if message is None:
                continue
            _, got, meta, _ = message
            if got == "stop":
                raise AgentError(f"node {self.node}: the coordinator stopped the launch before it began")
            if got == kind:
                return meta
        raise AgentError(f"node {self.node}: no '{kind}' from the coordinator at {self.endpoint} within {seconds:g} s")

    def _spawn(self, assignment: dict) -> None:
        config = Config(**assignment["config"])
        layout = Layout.of(config)
        ranks = layout.ranks_of(self.node)
        extra = {"RADIANCE_COORDINATOR": self.endpoint, "RADIANCE_COORDINATOR_PID": str(os.getpid()),
                 "RADIANCE_RUN_ID": self.folder.run_id, "RADIANCE_SECRET_FILE": str(self.folder.secret_file),
                 "RADIANCE_CONFIG": json.dumps(dataclasses.asdict(config)), "RADIANCE_KEYS": str(self.config.keys),
                 "RADIANCE_REMOTE": "1", "RADIANCE_NODE_ADDR": self.address}
        threads = config.threads or max(1, (os.cpu_count() or 1) // len(ranks))
        log.info("node %d: starting ranks %d-%d (%s)", self.node, ranks[0], ranks[-1], self.address)
        for local, rank in enumerate(ranks):
            self.ranks.append(spawn_rank(rank, layout.world, None, threads, {**extra, "LOCAL_RANK": str(local)},
                                         node=self.node))
        self.supervisor = Supervisor(self.ranks)

    def _watch(self) -> int:
        beat = 0.0
        while not self.stopping.is_set():
            self._events()
            self.supervisor.check()  # RankFailed: reported by run()
            now = time.monotonic()
            if now - beat >= BEAT_SECONDS:
                self.wire.send("node-beat", {"node": self.node})
                beat = now
            message = self.wire.recv(timeout_ms=50)
            if message is not None and message[1] == "stop":
                self.polite = not message[2].get("failed", False)
                return 0
        return 1

    polite = False

    def _teardown(self) -> None:
        self.supervisor.teardown(polite_seconds=5.0 if self.polite else 0.0)
        self.monitor.close(0)
        self.wire.socket.close(0)
        self.context.term()
        unlink_run(self.folder.run_id)
        self.folder.remove()


def serve_node(config: Config) -> None:
    """radiance-launch on a node but node 0: exits non-zero unless the launch ended as asked."""
    if Agent(config).run():
        raise AgentError(f"node {config.node_rank}: stopped before the launch ended")
