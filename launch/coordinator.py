"""The coordinator: spawns the ranks, runs the handshake (hello, facts, combined facts, resolve,
graph digest, ready) over zmq with a deadline at every stage, then writes each step's plan into
the plans ring every rank reads and takes the sampled tokens from rank 0's results ring
(step_rings.py), looking after zmq (errors, heartbeats) and the processes while it waits. It holds
no card and computes nothing."""

import dataclasses
import json
import os
import time

import zmq

from radiance.collectives.result_record import ResultRecordError
from radiance.collectives.ring import PeerGone
from radiance.collectives.wire import Wire
from radiance.config import Config
from radiance.log import get_logger
from radiance.ranks.layout import Layout

from .front import Front
from .remote_steps import RemoteSteps
from .run_folder import RunFolder
from .spawn import spawn_rank
from .step_rings import StepRings
from .supervisor import RankFailed, Supervisor

log = get_logger("radiance.launch")
DROPPED_REPORT_SECONDS = 10.0  # unauthenticated messages are logged at most this often while they come
# zmq (heartbeats, a rank's error, a rogue message) and the processes are looked after at least this
# often while steps run: the rings call the watch only once a wait outlasts a 20 ms slice, and a run of
# shorter steps (SmolLM2 on a fast CPU: ~5 ms) would otherwise never read them until the launch ends
LOOK_AFTER_SECONDS = 0.1


class LaunchError(RuntimeError):
    """The launch cannot go on: names the stage and the ranks concerned."""


class Coordinator:
    def __init__(self, config: Config, cards: list, threads: int, heartbeat_timeout: float = 15.0):
        """`config.world` ranks (TP x PP), this node's on `cards` (none: host ranks), each handed the
        config's fields; over several nodes the others' agents join (front.py) and start theirs."""
        self.world, self.stage_timeout, self.step_timeout = config.world, config.stage_timeout, config.step_timeout
        self.layout = Layout.of(config)
        self.heartbeat_timeout = heartbeat_timeout
        self.looked = time.monotonic()  # when look_after last ran
        self.context = zmq.Context()
        self.front = Front(config, self.context) if config.nnodes > 1 else None  # the keys, the TCP bind, the agents
        self.folder = RunFolder(self.front.keys.signing if self.front else None)
        socket = self.context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        try:
            if self.front:
                self.front.bind(socket)
            socket.bind(self.folder.endpoint("coordinator"))
        except BaseException:
            socket.close(0)
            if self.front:
                self.front.close()
            self.context.term()
            self.folder.remove()
            raise
        self.wire = Wire(socket, self.folder.secret)
        if self.front:
            self.front.attach_wire(self.wire)
        self.last_beat = {}
        extra = {"RADIANCE_COORDINATOR": self.folder.endpoint("coordinator"), "RADIANCE_COORDINATOR_PID": str(os.getpid()), "RADIANCE_RUN_ID": self.folder.run_id,
                 "RADIANCE_SECRET_FILE": str(self.folder.secret_file), "RADIANCE_CONFIG": json.dumps(dataclasses.asdict(config)),
                 **(self.front.rank_environment() if self.front else {})}
        node = 0 if self.front else None
        self.ranks = [spawn_rank(rank, self.world, cards[rank] if cards else None, threads, extra, node)
                      for rank in self.layout.ranks_of(0)]
        self.supervisor = Supervisor(self.ranks)
        self.remote = None  # RemoteSteps, once the ranks are ready (open_rings) where some are on other nodes
        self.last_step, self.last_result = {}, {}
        self.rings: StepRings | None = None  # once every rank has built (open_rings)
        self.early = []  # messages of a later stage that arrived before this one ended
        # zmq routing ids are the ROUTER's own, never a client's choice: a rank is known by the
        # route its signed hello came from, so no one can take over a rank by naming itself.
        self.routes: dict[int, bytes] = {}
        self.rank_of: dict[bytes, int] = {}
        self.dropped_reported, self.dropped_report_at = 0, -DROPPED_REPORT_SECONDS  # the first at once

    def send(self, rank: int, kind: str, meta: dict | None = None, arrays: dict | None = None) -> None:
        self.wire.send(kind, meta, arrays, route=[self.routes[rank]])

    def broadcast(self, kind: str, meta: dict | None = None, arrays: dict | None = None) -> None:
        for rank in sorted(self.routes):  # every rank, once each has said hello
            self.send(rank, kind, meta, arrays)

    def _named_rank(self, meta: dict, kind: str) -> int:
        """The rank a signed message names, which must be one of this launch's (signed, it comes from
        a holder of the secret: one that names another rank is broken, and ends the launch)."""
        rank = meta.get("rank") if isinstance(meta, dict) else None
        if type(rank) is not int or not 0 <= rank < self.world:
            raise LaunchError(f"a signed '{kind}' names rank {rank!r}, not a rank of this launch (0 to {self.world - 1})")
        return rank

    def _report_dropped(self) -> None:
        """Log unauthenticated messages while they come (at most every DROPPED_REPORT_SECONDS), not
        only at the end: a process of this user is writing to the launch's socket."""
        now = time.monotonic()
        if self.wire.dropped > self.dropped_reported and now - self.dropped_report_at >= DROPPED_REPORT_SECONDS:
            log.warning("dropped %d unauthenticated messages so far: a process of this user is writing to %s",
                        self.wire.dropped, self.folder.endpoint("coordinator"))
            self.dropped_reported, self.dropped_report_at = self.wire.dropped, now

    def _receive(self, deadline: float, what: str, waiting: set):
        while True:
            self.check()
            self._report_dropped()
            message = self.wire.recv(timeout_ms=50, routed=True)
            if message is None:
                # Only with nothing left to read: heartbeats queued while nobody listened (a chat
                # waiting for its user) are taken before a rank is judged silent.
                now = time.monotonic()
                for rank, beat in self.last_beat.items():
                    if now - beat > self.heartbeat_timeout:
                        raise self.failed(rank, f"no heartbeat for {now - beat:.0f} s (hung)")
                if now > deadline:
                    names = ", ".join(f"rank {rank}" for rank in sorted(waiting))
                    raise LaunchError(f"{what}: {names} did not answer within the deadline")
                continue
            route, kind, meta, arrays = message
            if kind == "heartbeat":
                self.last_beat[self._named_rank(meta, kind)] = time.monotonic()
                continue
            if self.front and self.front.nodes.take(route[0], kind, meta):
                continue
            if kind == "hello":
                rank = self._named_rank(meta, kind)
                self.routes[rank], self.rank_of[route[0]] = route[0], rank
            elif route[0] not in self.rank_of:
                raise LaunchError(f"{what}: a signed message from an unknown sender")
            rank = self.rank_of[route[0]]
            if kind == "error":
                raise self.failed(rank, meta.get("error", "an error"))
            return rank, kind, meta, arrays

    def failed(self, rank: int, how: str) -> RankFailed:
        """The failure of `rank`, with its last lines where it runs on this node."""
        local = [process for process in self.ranks if process.rank == rank]
        if local:
            return RankFailed(local[0], how)
        return RankFailed(None, how, rank=rank, node=self.layout.node(rank))

    def check(self, settle: float = 0.0) -> None:
        """This node's rank processes, and the other nodes' agents (`settle`: Supervisor.check's)."""
        self.supervisor.check(settle)
        if self.front:
            self.front.nodes.check()

    def gather(self, kind: str, what: str, timeout: float | None = None) -> dict:
        """One `kind` message from every rank, before the stage's deadline."""
        deadline = time.monotonic() + (timeout or self.stage_timeout)
        waiting, answers = set(range(self.world)), {}
        for message in [m for m in self.early if m[1] == kind]:
            self.early.remove(message)
            answers[message[0]] = message[2:]
            waiting.discard(message[0])
        while waiting:
            rank, got, meta, arrays = self._receive(deadline, what, waiting)
            if got != kind:
                if rank in waiting:
                    raise LaunchError(f"{what}: rank {rank} sent '{got}', expected '{kind}'")
                self.early.append((rank, got, meta, arrays))  # a rank already past this stage
                continue
            answers[rank] = (meta, arrays)
            waiting.discard(rank)
        return answers

    def open_rings(self, config: Config) -> None:
        """The plans ring, and the answering rank's results ring attached (it made it before
        'resolved'); over several nodes, the other nodes' ranks' plans and results by zmq."""
        remote = [rank for rank in range(self.world) if self.layout.node(rank) != 0]
        if remote:
            self.remote = RemoteSteps(remote, self.send, self.layout.node(self.layout.answering) != 0,
                                      self.wire.socket.poll)
        self.rings = StepRings(self.folder.run_id, len(self.ranks), self.folder.secret, config, self.remote)
        plans, results = self.rings.plans, self.rings.results
        local = len(self.ranks)
        answers = (f"results ring {results.slots} x {results.slot_bytes >> 10} KiB from rank {self.layout.answering}"
                   if results is not self.remote else f"results by zmq from rank {self.layout.answering}")
        log.info("steps go through shared memory: plans ring %d x %d KiB to %d rank%s%s, %s", plans.slots,
                 plans.slot_bytes >> 10, local, "" if local == 1 else "s",
                 f" (by zmq to the other nodes' {self.world - local})" if self.remote else "", answers)

    def submit(self, arrays: dict, feed=None) -> None:
        """One step's plan (and its feed, run ahead) to every rank."""
        try:
            self.rings.publish(arrays, feed, self.step_timeout, self.look_after)
        except PeerGone:  # a rank ended without reading its plans; the supervisor names how
            self.check(settle=1.0)
            raise LaunchError("step: a rank is gone before reading its plan") from None
        except TimeoutError as error:
            raise LaunchError(str(error)) from None

    def collect(self):
        """The tokens rank 0 sampled in the oldest step submitted and not collected."""
        try:
            meta, result = self.rings.result(self.step_timeout, self.look_after)
        except PeerGone:  # the answering rank ended before its result; the supervisor names how
            self.check(settle=1.0)
            raise self.failed(self.layout.answering, "gone before its result") from None
        except TimeoutError as error:
            raise LaunchError(str(error)) from None
        except ResultRecordError as error:
            raise LaunchError(f"step: rank {self.layout.answering}'s {error}") from None
        self.last_step, self.last_result = meta, result
        if time.monotonic() - self.looked >= LOOK_AFTER_SECONDS:
            self.look_after()
        return result["tokens"]

    def idle(self) -> None:
        """Between steps when there is nothing to run (a server waiting for requests): look after
        the ranks, so an idle launch notices a failed rank and does not take its own silence for a
        hung one."""
        self.look_after()

    def look_after(self) -> None:
        """Take what zmq brought (heartbeats; an error ends the launch naming its rank; nothing else
        is due once the ranks are ready), then check the processes and the heartbeats' ages."""
        self.looked = time.monotonic()
        while (message := self.wire.recv(timeout_ms=0, routed=True)) is not None:
            route, kind, meta, arrays = message
            if kind == "heartbeat":
                self.last_beat[self._named_rank(meta, kind)] = time.monotonic()
            elif self.front and self.front.nodes.take(route[0], kind, meta):
                continue
            elif kind == "error" and route[0] in self.rank_of:
                raise self.failed(self.rank_of[route[0]], meta.get("error", "an error"))
            elif kind == "result" and self.remote and self.rank_of.get(route[0]) == self.layout.answering:
                self.remote.arrived(arrays["record"].tobytes())
            else:
                raise LaunchError(f"between handshake and stop: an unexpected '{kind}' message")
        self._report_dropped()
        self.check()
        now = time.monotonic()
        for rank, beat in self.last_beat.items():
            if now - beat > self.heartbeat_timeout:
                raise self.failed(rank, f"no heartbeat for {now - beat:.0f} s (hung)")

    def _ask_to_stop(self) -> None:
        """Once the ranks read the plans ring, 'stop' is its last record; before, a zmq message."""
        if self.rings is None:
            self.broadcast("stop")
            return
        try:
            self.rings.stop()
        except Exception as error:  # noqa: BLE001  (a rank that cannot read it gets SIGTERM instead)
            log.warning("the ranks could not be asked to stop: %s", error)

    def stop(self, failed: bool) -> None:
        """End the launch: ask the ranks to stop (unless one failed), then make sure they did."""
        if self.wire.dropped:
            log.warning("dropped %d unauthenticated messages", self.wire.dropped)
        try:
            if not failed:
                self._ask_to_stop()
            if self.front:
                self.front.nodes.stop(failed)  # each agent takes its own ranks down
            self.supervisor.teardown(polite_seconds=0.0 if failed else 5.0)
        finally:
            if self.rings is not None:
                self.rings.close()
            if self.front:
                self.front.close()
            self.wire.socket.close(0)
            self.context.term()
            from radiance.collectives.shm import unlink_run  # the segments every rank made
            unlink_run(self.folder.run_id)
            self.folder.remove()
