"""The coordinator's end of a step: the plan into the `plans` broadcast ring (one record, read by
every rank), rank 0's result out of the `results` ring; no zmq message on the way (docs/RUNTIME.md,
"A step"). zmq is looked after while waiting (`watch`: errors, heartbeats, dead processes), every
20 ms slice of the wait, so a rank that dies mid-step still ends the launch at once, by name."""

from __future__ import annotations

import time
from collections.abc import Callable

from radiance.abi import RAD_STEP_CONTEXT_LENS, RAD_STEP_IDS
from radiance.collectives.ring import RingReader, RingTimeout, RingWriter
from radiance.collectives.ring_record import RecordCodec, figures_dict
from radiance.generation.options import EngineOptions

PLAN_SLOTS = 4  # a step and the stop after it fit with room to spare: the ranks run one step at a time
PLAN_HEADER_BYTES = 4096  # the record's JSON header (11 arrays' names, dtypes, shapes), generously
# Waiting for rank 0's result: asleep until EXPECT_SHARE of the last step of this shape (less a
# margin), then spinning at most SPIN_SHARE of it (and SPIN_MAX_S), then asleep in slices.
EXPECT_SHARE, EXPECT_MARGIN_S = 0.85, 3e-4
SPIN_SHARE, SPIN_MAX_S = 0.3, 5e-3


def plan_bytes(options: EngineOptions) -> int:
    """The largest plan record of an engine: generation/step_plan.py's arrays at their largest
    (every array padded to 8 bytes), and its header."""
    tokens, seqs, blocks = options.max_step_tokens, options.max_seqs, options.max_blocks
    arrays = 3 * tokens * 4 + (seqs + 1) * 4 + 5 * seqs * 4 + seqs * blocks * 4 + seqs * 2 * 8
    return PLAN_HEADER_BYTES + arrays + 11 * 8


class StepRings:
    """Made once every rank has built (rank 0 has created the results ring): creates the plans ring,
    which the ranks attach when told `go`."""

    def __init__(self, run_id: str, world: int, secret: bytes, options: EngineOptions):
        self.plans = RingWriter.create(run_id, "plans", world, PLAN_SLOTS, plan_bytes(options), secret)
        try:
            self.results = RingReader.attach(run_id, "results", 0, secret)
        except BaseException:
            self.plans.close()
            raise
        self.encoder, self.decoder = RecordCodec(), RecordCodec()
        self.seconds: dict[tuple[int, int], float] = {}  # the last step of each (tokens, seqs)

    def step(self, arrays: dict, timeout: float, watch: Callable[[], None]) -> tuple[str, dict, dict]:
        """Publish the plan, wait for rank 0's (kind, meta, arrays). `watch` raises for a failed rank.
        The wait sleeps through most of a step as long as the last one of the same shape, then spins
        (a wake from sleep would cost more than the plan's delivery), then sleeps again."""
        shape = (len(arrays[RAD_STEP_IDS]), len(arrays[RAD_STEP_CONTEXT_LENS]))
        last = self.seconds.get(shape, 0.0)
        expect, spin = max(0.0, EXPECT_SHARE * last - EXPECT_MARGIN_S), min(SPIN_MAX_S, SPIN_SHARE * last + 2e-4)
        start = time.perf_counter()
        self.plans.publish(self.encoder.encode("step", None, arrays), timeout=timeout, check=watch)
        try:
            payload = self.results.read(timeout=timeout, check=watch, spin_s=spin, expect_s=expect)
        except RingTimeout:
            raise TimeoutError(f"step: rank 0's result did not come within {timeout:g} s") from None
        kind, meta, result = self.decoder.decode(payload)
        now = time.perf_counter()
        self.seconds[shape] = now - start
        if "figures" in result:  # rank 0's; the step's delivery split into plan out and result back
            figures = figures_dict(result.pop("figures"))
            figures["plan_s"], figures["result_s"] = figures.pop("received_at") - start, now - figures.pop("answered_at")
            meta.update(figures)
        return kind, meta, result

    def stop(self) -> None:
        """The last record every rank reads: stop."""
        self.plans.publish(self.encoder.encode("stop"), timeout=2.0)

    def close(self) -> None:
        self.results.close()
        self.plans.close()

