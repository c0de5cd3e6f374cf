"""A rank's part of the launch, stage by stage: hello, facts, the combined facts, its collective
buffers, its slice of the model resolved and loaded, ready; then one step per plan until stop."""

import os
import time

import numpy as np

from radiance.engine.registry import Registry
from radiance.engine.shard import Shard
from radiance.generation.options import EngineOptions
from radiance.generation.worker import Worker
from radiance.log import get_logger

from radiance.ranks.device.selection import backend_name

from .facts import measure_facts

log = get_logger("radiance.rank")


class RankSession:
    def __init__(self, wire, rank: int, world: int, run_id: str, options: dict):
        self.wire, self.rank, self.world, self.run_id, self.options = wire, rank, world, run_id, options
        self.worker = self.peers = self.gate = self.device_peers = None

    def expect(self, kind: str):
        _, got, meta, arrays = self.wire.recv()
        if got == "stop":
            raise SystemExit(0)
        if got != kind:
            raise RuntimeError(f"expected '{kind}' from the coordinator, got '{got}'")
        return meta, arrays

    def _exchange(self, payload: bytes) -> list[bytes]:
        """An all-gather through the coordinator, for the P2P probe."""
        self.wire.send("probe", arrays={"payload": np.frombuffer(payload, np.uint8)})
        _, arrays = self.expect("probed")
        return [arrays[f"rank{rank}"].tobytes() for rank in range(self.world)]

    def _peers(self, combined: dict):
        """This rank's collective buffers, created, then attached to every peer's."""
        if self.world == 1:
            self.wire.send("created")
            self.expect("attach")
            return None
        from radiance.collectives.peers import HostPeers

        self.peers = HostPeers.create(self.run_id, self.rank, self.world, self.worker.collective_bytes())
        self.wire.send("created")
        self.expect("attach")
        attached = self.peers.attach()
        if self.worker.device is None:
            return attached
        # A card rank: the device rows' buffers (P2P through IPC handles, or the _host twin's pinned
        # shared memory), set up over the host buffers just attached.
        from radiance.collectives.device_peers import DevicePeers

        self.device_peers = DevicePeers(self.worker.device, self.peers, bool(combined["device.p2p"]),
                                        self.worker.collective_bytes())
        return self.device_peers

    def run(self) -> None:
        self.card = backend_name() is not None
        self.wire.send("hello", {"rank": self.rank, "pid": os.getpid(), "card": self.card})
        engine_options = EngineOptions(**self.options["engine"])
        registry = Registry(engine_options.radiance_home, engine_options.kernels)
        self.worker = Worker(engine_options, registry, Shard(self.rank, self.world))
        self.wire.send("facts", measure_facts(self.rank, self.world, self._exchange if self.card else None))
        combined = self.expect("combined")[0]["facts"]
        from radiance.collectives.gate import LinkGate, LinkScheduler

        self.gate = LinkGate.create(self.run_id, self.rank)
        self.worker.build(combined, self._peers(combined), LinkScheduler(self.gate))
        self.wire.send("resolved", {"digest": self.worker.digest, "lines": self.worker.lines})
        self.expect("go")
        self.wire.send("ready")
        self._serve()

    def _serve(self) -> None:
        executor = self.worker.executor
        executor.profile = bool(self.options.get("profile"))
        while True:
            _, kind, meta, arrays = self.wire.recv()
            if kind == "stop":
                return
            if kind != "step":
                raise RuntimeError(f"unexpected '{kind}' from the coordinator")
            received = time.perf_counter()
            tokens = self.worker.execute(arrays)
            if self.rank == 0:
                timing = {"compute": time.perf_counter() - received,  # collective ops, fused ones too:
                          "collectives": sum(t for op, t in executor.op_seconds.items() if op.startswith("all_"))}
                if executor.profile:
                    timing["ops"] = dict(executor.op_seconds)
                executor.op_seconds.clear()
                holds = self.worker.link.hold_stats()  # cumulative, for a server's /metrics
                timing.update(gate_holds=holds["holds"], gate_hold_s=holds["total_s"])
                arrays = {"tokens": tokens}
                shown = self.options.get("return_buffer")  # a debugging aid: a buffer's rows, e.g. logits
                if shown:
                    arrays[shown] = executor.read_buffer(shown, len(tokens))
                self.wire.send("result", timing, arrays)

    def close(self) -> None:
        """Shared memory first: whatever fails after, nothing of this rank stays in /dev/shm."""
        for resource in (self.device_peers, self.peers, self.gate):
            if resource is not None:
                try:
                    resource.close()
                except Exception as error:  # keep closing the rest
                    log.warning("closing %s: %s", type(resource).__name__, error)
        if self.worker is not None and hasattr(self.worker, "executor"):
            self.worker.close()
