"""A rank's part of the launch, stage by stage over zmq: hello, facts, the combined facts, its
collective buffers, its slice of the model resolved and loaded (rank 0 then makes the results
ring), go (the plans ring is there to attach), ready; then one step per record of the plans ring
until its stop record, rank 0 writing each step's tokens and figures into the results ring. A
step's feed (run ahead) takes ids from the tokens this rank sampled in the step before: every rank
samples the same tokens from the same gathered logits, so none waits for rank 0's."""

import os
import sys
import time

import numpy as np

from radiance.collectives.ring import RingReader, RingWriter
from radiance.collectives.result_record import ResultWriter
from radiance.collectives.ring_record import ops_arrays
from radiance.collectives.shm import stage_run_id
from radiance.config import Config
from radiance.device.selection import backend_name
from radiance.generation.plan_record import PlanReader
from radiance.log import get_logger

from .boundaries import Boundaries
from .facts import measure_facts
from .fed_tokens import FedTokens
from .layout import Layout
from .wire_steps import WirePlans, WireResults
from .worker import Worker

log = get_logger("radiance.rank")
RESULT_SLOTS = 2
RESULT_META_BYTES = 16384  # a result record's head and its tail's header: every op's name when profiling


class RankSession:
    def __init__(self, wire, rank: int, world: int, run_id: str, config: Config, secret: bytes, keys=None,
                 remote: bool = False, address: str = "127.0.0.1"):
        """`keys`: the launch's CURVE keys (launches across nodes); `remote`: this rank is on another
        node than the coordinator's, so its steps come over the wire (wire_steps.py); `address`:
        its node's, where a stage boundary from another host binds."""
        self.wire, self.rank, self.world, self.run_id, self.config = wire, rank, world, run_id, config
        self.secret, self.remote = secret, remote
        self.layout = Layout.of(config)
        self.boundaries = Boundaries(run_id, rank, self.layout, keys, address) if config.pp > 1 else None
        self.worker = self.peers = self.gate = self.device_peers = self.plans = self.results = None

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
        """This rank's collective buffers (its stage's TP peers) and the receiving end of its stage
        boundary, created, then attached to every peer's, and the sending end to the next stage's."""
        same_host, pipe = combined.get("device.same_host", 1), {}
        depth = 2 * self.worker.micro_batches  # token messages in flight: two steps' (token_pipe.py)
        if self.boundaries is not None:
            pipe = self.boundaries.create(same_host, self.worker.boundary_bytes(), self.config.max_seqs, depth)
        shard = self.layout.shard(self.rank)
        if shard.world > 1:
            from radiance.collectives.peers import HostPeers

            run = self.run_id if self.layout.pp == 1 else stage_run_id(self.run_id, self.layout.stage(self.rank).index)
            self.peers = HostPeers.create(run, shard.rank, shard.world, self.worker.collective_bytes())
        self.wire.send("created", {"pipe": pipe})
        told = self.expect("attach")[0]
        if self.boundaries is not None:
            self.boundaries.attach(same_host, told["pipes"], self.config.max_seqs, depth)
            self._fed(same_host)
        if self.peers is None:
            return None
        attached = self.peers.attach()
        if self.worker.device is None:
            return attached
        # A card rank: the device rows' buffers (P2P through IPC handles, or the _host twin's pinned
        # shared memory), set up over the host buffers just attached.
        from radiance.collectives.device_peers import DevicePeers

        self.device_peers = DevicePeers(self.worker.device, self.peers, bool(combined["device.p2p"]),
                                        self.worker.collective_bytes(), wire=self.worker.collective_wire())
        return self.device_peers

    def _fed(self, same_host: int) -> None:
        """Where the worker's feeds come from, and where its sampled tokens go (fed_tokens.py)."""
        boundaries, stage = self.boundaries, self.layout.stage(self.rank)
        refusal = None
        if stage.first and not same_host:
            refusal = (f"run ahead over pipeline stages on different hosts: rank {self.rank} of the first stage "
                       "has no token pipe from the last (--no-run-ahead)")
        self.worker.fed = FedTokens(boundaries.tokens_in, refusal)
        self.worker.tokens_out = boundaries.tokens_out

    def run(self) -> None:
        self.card = backend_name() is not None
        hello = {"rank": self.rank, "pid": os.getpid(), "card": self.card}
        if self.boundaries is not None:
            hello["host"] = self.boundaries.hello()
        self.wire.send("hello", hello)
        self.worker = Worker(self.config, self.layout.shard(self.rank), stage=self.layout.stage(self.rank))
        facts = measure_facts(self.rank, self.world, self._exchange if self.card else None, self.config.chain)
        if self.boundaries is not None:
            facts["device.same_host"] = self.boundaries.same_host(self.expect("hosts")[0]["hosts"])
        self.wire.send("facts", facts)
        combined = self.expect("combined")[0]["facts"]
        if self.boundaries is not None:
            self.boundaries.measured()  # every rank has measured before the facts were combined
        from radiance.collectives.gate import LinkGate, LinkScheduler

        self.gate = LinkGate.create(self.run_id, self.rank)
        peers = self._peers(combined)
        self.worker.build(combined, peers, LinkScheduler(self.gate),
                          self.boundaries.pipes() if self.boundaries is not None else None)
        if self.config.debug_selection and self.rank % self.layout.tp == 0:  # a stage's ranks resolve alike
            stage = self.layout.stage(self.rank)
            header = [f"stage {stage.index} of {self.layout.pp}:"] if self.layout.pp > 1 else []
            print("\n".join(header + self.worker.graph.report()), file=sys.stderr, flush=True)
        if self.rank == self.layout.answering:
            self.results = WireResults(self.wire) if self.remote else RingWriter.create(
                self.run_id, "results", 1, RESULT_SLOTS, self._result_bytes(), self.secret)
        self.wire.send("resolved", {"digest": self.worker.digest, "lines": self.worker.lines,
                                    "stage": self.layout.stage(self.rank).index,
                                    "step_limits": list(self.worker.step_limits)})
        self.expect("go")
        self.plans = WirePlans(self.wire) if self.remote else RingReader.attach(self.run_id, "plans", self.rank,
                                                                                   self.secret)
        self.wire.send("ready")
        self._serve()

    def _result_bytes(self) -> int:
        """Rank 0's largest result: a token per sequence, the figures, and the buffer it shows, if asked."""
        return RESULT_META_BYTES + self.config.max_seqs * 8 + self.worker.returned_bytes()

    def _serve(self) -> None:
        executor = self.worker.executor
        executor.profile = self.config.profile
        # plans are taken into the reader's own buffer and copied from there into the step inputs
        # (generation/plan_record.py), with their feed where the worker takes fed plans; over the
        # wire they come as bytes
        worker = self.worker
        reader = PlanReader(executor.inputs, whole=worker.takes_whole_plans, feeds=worker.takes_fed_plans)
        encoder, plans, remote = ResultWriter(), self.plans, self.remote
        answered = None
        while True:
            ready = time.perf_counter()
            # sleeps between steps; SIGTERM ends it
            plan = reader.decode(plans.read()) if remote else reader.take(plans, worker.last_seqs)
            if plan.kind == "stop":
                return
            received = time.perf_counter()
            step_tokens = plan.tokens
            tokens = worker.execute_record(plan, reader)
            if self.rank == self.layout.answering:
                timing = {"compute": time.perf_counter() - received,  # collective ops, fused ones too:
                          "collectives": sum(t for op, t in executor.op_seconds.items() if op.startswith("all_"))}
                ops = dict(executor.op_seconds) if executor.profile else None
                executor.op_seconds.clear()
                holds, hold_s = self.worker.link.hold_totals()  # cumulative, for a server's /metrics
                # when the plan was in hand and the result went out (perf_counter: CLOCK_MONOTONIC, the
                # coordinator's clock too), so the step's delivery splits into plan out and result back
                # the plan's delivery: from the later of its sending and this rank being ready for it
                # to the step's inputs written (docs/RUNTIME.md, "What a step's delivery costs"); on
                # another node than the coordinator's (another clock), from this rank being ready
                since = ready if self.remote else max(ready, reader.sent())
                timing.update(gate_holds=holds, gate_hold_s=hold_s, received_at=received,
                              parts=self.worker.parts, delivery=self.worker.started - since,
                              waited=0.0 if answered is None else received - answered, answered_at=time.perf_counter())
                answered = timing["answered_at"]  # from here to the next plan in hand (its result sent), rank 0 waits
                extra = ops_arrays(ops)
                # what config.return_buffer names: a debugging aid, speculative decoding's logits
                extra.update(self.worker.returned(step_tokens, len(tokens)))
                self.results.publish(encoder.encode(tokens, timing, extra))

    def close(self) -> None:
        """Shared memory first: whatever fails after, nothing of this rank stays in /dev/shm."""
        for resource in (self.plans, self.results, self.device_peers, self.peers, self.gate, self.boundaries):
            if resource is not None:
                try:
                    resource.close()
                except Exception as error:  # keep closing the rest
                    log.warning("closing %s: %s", type(resource).__name__, error)
        if self.worker is not None and hasattr(self.worker, "executor"):
            self.worker.close()
