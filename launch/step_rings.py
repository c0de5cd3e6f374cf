"""The coordinator's end of a step: the plan into the `plans` broadcast ring (one record, read by
every rank), rank 0's result out of the `results` ring; no zmq message on the way (docs/RUNTIME.md,
"A step"). zmq is looked after while waiting (`watch`: errors, heartbeats, dead processes), every
20 ms slice of the wait, so a rank that dies mid-step still ends the launch at once, by name.

Run ahead, a plan goes out while the step before it runs (publish, then the result of the one
before: at most two steps between the coordinator and rank 0), and carries its feed."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from radiance.abi import RAD_STEP_CONTEXT_LENS, RAD_STEP_IDS
from radiance.collectives.ring import RingReader, RingTimeout, RingWriter
from radiance.collectives.result_record import ResultReader
from radiance.collectives.ring_record import pop_ops
from radiance.config import Config
from radiance.generation import plan_record
from radiance.generation.feed import Feed

# Two steps (run ahead) and the stop after them fit with room to spare: the coordinator publishes
# a plan only once it holds the result of the step two before it.
PLAN_SLOTS = 4
# Waiting for rank 0's result: asleep until EXPECT_SHARE of the last step of this shape (less a
# margin), then spinning at most SPIN_SHARE of it (and SPIN_MAX_S), then asleep in slices.
EXPECT_SHARE, EXPECT_MARGIN_S = 0.85, 3e-4
SPIN_SHARE, SPIN_MAX_S = 0.3, 5e-3
# Run ahead, asleep until AHEAD_SHARE of rank 0's last step of this shape from when it began this one
# (its own clock: when it answered the step before; else as above), then naps of POLL_SHARE of the
# last step (within the bounds) until it comes. The bound is wide: a step loaded to 60 ms (TP 2 on
# 2 cores beside a busy process) in 1 ms naps woke the coordinator 9 to 13 times a step, each a
# rank's core taken, where a result collected a few ms late costs nothing run ahead.
AHEAD_SHARE = 1.0
POLL_SHARE, POLL_MIN_S, POLL_MAX_S = 0.05, 5e-5, 5e-3


def plan_bytes(config: Config) -> int:
    """The largest plan record of an engine (generation/plan_record.py): every array at its largest
    and a feed of a token for every sequence."""
    return plan_record.size(config.max_step_tokens, config.max_seqs, config.max_blocks, config.max_seqs)


class StepRings:
    """Made once every rank has built (rank 0 has created the results ring): creates the plans ring,
    which the ranks attach when told `go`."""

    def __init__(self, run_id: str, world: int, secret: bytes, config: Config, remote=None):
        """`world`: this node's ranks, which read the plans ring; `remote`: launch/remote_steps.py's
        RemoteSteps where ranks are on other nodes (their plans go by zmq, and the answering rank's
        results come back that way when it is one of them)."""
        self.plans = RingWriter.create(run_id, "plans", world, PLAN_SLOTS, plan_bytes(config), secret)
        self.remote = remote
        try:
            self.results = remote if remote and remote.answers else RingReader.attach(run_id, "results", 0, secret)
        except BaseException:
            self.plans.close()
            raise
        self.decoder = ResultReader()  # rank 0's results
        self.seconds: dict[tuple[int, int], float] = {}  # the last step of each (tokens, seqs), round trip
        self.stepped: dict[tuple[int, int], float] = {}  # the same, rank 0's own: from begun to answered
        self.sent: deque = deque()  # (when it was published, its shape) of each step not collected yet
        self.arrived = 0.0  # when the last result came
        # when rank 0 answered the last step: on this node its perf_counter is ours (CLOCK_MONOTONIC)
        self.answered = None if remote and remote.answers else 0.0

    def publish(self, arrays: dict, feed: Feed | None, timeout: float, watch: Callable[[], None]) -> None:
        """The plan (and its feed) to every rank. `watch` raises for a failed rank."""
        start = time.perf_counter()
        payload = plan_record.encode(arrays, feed, start)
        self.plans.publish(payload, timeout=timeout, check=watch)
        if self.remote:
            self.remote.publish(payload)
        self.sent.append((start, (len(arrays[RAD_STEP_IDS]), len(arrays[RAD_STEP_CONTEXT_LENS]))))

    def result(self, timeout: float, watch: Callable[[], None]) -> tuple[dict, dict]:
        """Rank 0's (meta, arrays) of the oldest step published and not collected (collectives/
        result_record.py: meta its figures, arrays its tokens and what it returned). The wait
        sleeps through most of a step as long as the last one of the same shape, then spins (a wake
        from sleep would cost more than the plan's delivery), then sleeps again."""
        start, shape = self.sent.popleft()
        begun = max(start, self.arrived)  # run ahead, rank 0 starts a step once the one before is done
        last = self.seconds.get(shape, 0.0)
        expect = max(0.0, begun + EXPECT_SHARE * last - EXPECT_MARGIN_S - time.perf_counter())
        spin = min(SPIN_MAX_S, SPIN_SHARE * last + 2e-4)
        poll = 0.0
        if self.sent:
            # Run ahead, the ranks have the next step already: the result is off the critical path,
            # so no spin (it would take a core from them) and no futex (rank 0 would pay ~270 us to
            # wake a sleeper): asleep until it is due, then naps of a twentieth of a step. Due by
            # rank 0's own clock, not the coordinator's (which is late by its naps and its planning,
            # and would carry that lateness into the next estimate): every wake of the coordinator
            # during a step is a rank's core taken where the ranks hold them all (TP 2 on 2 cores:
            # 5 to 20 naps a step when it woke at 85 % of a round trip counted from its own arrival).
            if self.answered is not None:
                last = self.stepped.get(shape, 0.0)
                expect = max(0.0, max(start, self.answered) + AHEAD_SHARE * last - time.perf_counter())
            spin, poll = 0.0, max(POLL_MIN_S, min(POLL_MAX_S, POLL_SHARE * last))
        try:
            payload = self.results.read(timeout=timeout, check=watch, spin_s=spin, expect_s=expect, poll_s=poll)
        except RingTimeout:
            raise TimeoutError(f"step: rank 0's result did not come within {timeout:g} s") from None
        meta, tokens, result = self.decoder.decode(payload)  # rank 0's figures, its tokens, the rest
        ops = pop_ops(result)
        if ops is not None:
            meta["ops"] = ops
        now = self.arrived = time.perf_counter()
        answered = meta.pop("answered_at")
        if self.answered is not None:
            self.stepped[shape] = answered - max(start, self.answered)
            self.answered = answered
        self.seconds[shape] = now - begun
        # the step's delivery split into plan out and result back
        meta["plan_s"], meta["result_s"] = meta.pop("received_at") - start, now - answered
        result["tokens"] = tokens
        return meta, result

    def stop(self) -> None:
        """The last record every rank reads: stop."""
        payload = plan_record.stop()
        self.plans.publish(payload, timeout=2.0)
        if self.remote:
            self.remote.publish(payload)

    def close(self) -> None:
        self.results.close()
        self.plans.close()

