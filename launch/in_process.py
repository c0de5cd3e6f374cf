"""One rank in this process (`radiance`, TP 1): a Worker, on the card this process may use or on
the host. Where config.device is auto and no visibility variable names one card already, the
process first pins itself to the first card launch/devices.py finds, as the launcher pins a rank,
before any GPU library starts.

Steps run in the order submitted. Synchronously, a step runs when it is collected; run ahead, a
thread of its own runs them (step_thread.py) while the engine's thread plans the next, and the feed
reads the tokens the worker's executor holds from the step before."""

from __future__ import annotations

import sys
import threading
import time
from collections import deque

import numpy as np

from radiance.abi import RAD_STEP_IDS
from radiance.config import Config
from radiance.generation.feed import Feed
from radiance.generation.text import TextCodec
from radiance.log import get_logger
from radiance.ranks.worker import Worker

from .devices import pin_this_process
from .ranks import Ranks, run_ahead_default
from .step_thread import StepThread

log = get_logger("radiance.cli")
IDLE_SECONDS = 1.0


class InProcessRanks(Ranks):
    world = 1

    def __init__(self, config: Config):
        if config.device == "auto":
            card = pin_this_process()
            if card is not None:
                log.info("running on %s card %d%s", card.vendor, card.index,
                         f" (PCI {card.bus_id})" if card.bus_id else "")
        self.worker = Worker(config).build()
        self.worker.executor.profile = config.profile
        self.config, self.digest, self.lines = config, self.worker.digest, list(self.worker.lines)
        self.step_limits = self.worker.step_limits
        if config.debug_selection:
            print("\n".join(self.worker.graph.report()), file=sys.stderr)
        container = self.worker.model.container
        self.text = TextCodec(container.tokenizer, container.chat_template, self.worker.model.hyper, config.model)
        self.last_result, self._stats = {}, {}
        self.run_ahead = run_ahead_default(config, card=self.worker.device is not None)
        self._held: deque = deque()  # synchronously: the steps submitted, run when collected
        self._answered = None  # when the last step ended (perf_counter)
        self._thread = StepThread(self._step, self.worker.device) if self.run_ahead else None

    def submit(self, arrays: dict, feed: Feed | None = None) -> None:
        if self._thread is not None:
            self._thread.submit(arrays, feed)
        else:
            self._held.append((arrays, feed))

    def collect(self) -> np.ndarray:
        if self._thread is not None:
            tokens, self._stats, self.last_result = self._thread.collect()
        else:
            tokens, self._stats, self.last_result = self._step(*self._held.popleft())
        return tokens

    def _step(self, arrays: dict, feed: Feed | None) -> tuple:
        """Run one step: (tokens, rank 0's figures, the result)."""
        start = time.perf_counter()
        tokens = self.worker.execute(arrays, feed)
        executor = self.worker.executor
        holds = self.worker.link.hold_stats()  # cumulative, for a server's /metrics
        stats = {"compute": time.perf_counter() - start, "gate_holds": holds["holds"], "parts": self.worker.parts,
                 "gate_hold_s": holds["total_s"],  # collective ops (fused ones too), timed when profiling:
                 "collectives": sum(t for op, t in executor.op_seconds.items() if op.startswith("all_")),
                 "waited": 0.0 if self._answered is None else start - self._answered}
        if self.config.profile:
            stats["ops"] = dict(executor.op_seconds)
        executor.op_seconds.clear()
        result = {"tokens": tokens, **self.worker.returned(len(arrays[RAD_STEP_IDS]), len(tokens))}
        self._answered = time.perf_counter()
        return tokens, stats, result

    def idle(self, wake: threading.Event) -> None:
        wake.wait(IDLE_SECONDS)

    def step_stats(self) -> dict:
        return dict(self._stats)

    def close(self, failed: bool = False) -> None:
        if self._thread is not None:
            self._thread.close()  # a step still running ends first: the worker is closed after it
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.close()
