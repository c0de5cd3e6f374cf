"""One rank in this process (`radiance`, TP 1): a Worker, on the card this process may use or on
the host. Where options.device is auto and no visibility variable names one card already, the
process first pins itself to the first card launch/devices.py finds, as the launcher pins a rank,
before any GPU library starts."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from radiance.engine.registry import Registry
from radiance.generation.options import EngineOptions
from radiance.generation.text import TextCodec
from radiance.generation.worker import Worker
from radiance.log import get_logger

from .devices import pin_this_process
from .ranks import Ranks, RankSettings

log = get_logger("radiance.cli")
IDLE_SECONDS = 1.0


class InProcessRanks(Ranks):
    world = 1

    def __init__(self, options: EngineOptions, settings: RankSettings):
        if options.device == "auto":
            card = pin_this_process()
            if card is not None:
                log.info("running on %s card %d%s", card.vendor, card.index,
                         f" (PCI {card.bus_id})" if card.bus_id else "")
        self.settings = settings
        self.worker = Worker(options, Registry(options.radiance_home, options.kernels)).build()
        self.worker.executor.profile = settings.profile
        self.options, self.digest, self.lines = options, self.worker.digest, list(self.worker.lines)
        if settings.debug_selection:
            print("\n".join(self.worker.graph.report()), file=sys.stderr)
        container = self.worker.model.container
        self.text = TextCodec(container.tokenizer, container.chat_template, self.worker.model.hyper, options.model)
        self.last_result, self._stats = {}, {}

    def execute(self, arrays: dict) -> np.ndarray:
        start = time.perf_counter()
        tokens = self.worker.execute(arrays)
        executor = self.worker.executor
        holds = self.worker.link.hold_stats()  # cumulative, for a server's /metrics
        self._stats = {"compute": time.perf_counter() - start, "gate_holds": holds["holds"],
                       "gate_hold_s": holds["total_s"],  # collective ops (fused ones too), timed with --profile:
                       "collectives": sum(t for op, t in executor.op_seconds.items() if op.startswith("all_"))}
        if self.settings.profile:
            self._stats["ops"] = dict(executor.op_seconds)
        executor.op_seconds.clear()
        self.last_result = {"tokens": tokens}
        shown = self.settings.return_buffer
        if shown:
            self.last_result[shown] = self.worker.executor.read_buffer(shown, len(tokens))
        return tokens

    def idle(self, wake: threading.Event) -> None:
        wake.wait(IDLE_SECONDS)

    def step_stats(self) -> dict:
        return dict(self._stats)

    def close(self, failed: bool = False) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            worker.close()
