"""N rank processes (`radiance-launch`, or `radiance --tp N`): one per visible card, or host ranks
where there is none, started, shaken hands with and supervised by a Coordinator in this process."""

from __future__ import annotations

import os
import threading

import numpy as np

from radiance.config import Config
from radiance.generation.feed import Feed
from radiance.generation.text import TextCodec
from radiance.log import get_logger
from radiance.weights.container_reader import open_container

from .coordinator import Coordinator, LaunchError
from .devices import visible_cards
from .handshake import handshake
from .ranks import Ranks, run_ahead_default

log = get_logger("radiance.launch")
IDLE_SECONDS = 0.2  # while idle, the ranks' heartbeats are taken at least this often
LOAD_SECONDS = 600.0  # loading and resolving may take longer than the other stages


def choose_cards(tp: int) -> list:
    """The first `tp` visible cards, or none (host ranks); more ranks than cards is an error."""
    cards = visible_cards()
    if not cards:
        log.info("no card visible: starting %d host rank%s", tp, "" if tp == 1 else "s")
        return []
    if tp > len(cards):
        raise LaunchError(f"--tp {tp} needs {tp} cards, {len(cards)} visible "
                          f"({', '.join(f'{c.vendor} {c.index}' for c in cards)})")
    return cards[:tp]


class LaunchedRanks(Ranks):
    def __init__(self, config: Config):
        local = config.world // config.nnodes  # this node's ranks
        cards = choose_cards(local) if config.nnodes == 1 else []  # over nodes: host ranks (docs/RUNTIME.md)
        threads = config.threads or max(1, (os.cpu_count() or 1) // local)
        with open_container(config.model) as container:
            self.text = TextCodec(container.tokenizer, container.chat_template, container.hyper, config.model)
        self.config, self.world = config, config.world
        self.coordinator = Coordinator(config, cards, threads)
        try:
            agreement = handshake(self.coordinator, config, load_timeout=max(config.stage_timeout, LOAD_SECONDS))
        except BaseException:
            self.coordinator.stop(failed=True)
            raise
        self.facts, self.digest, self.lines = agreement.facts, agreement.digest, list(agreement.lines)
        self.run_ahead = run_ahead_default(config, card=bool(cards))
        self.closed = False

    @property
    def last_result(self) -> dict:
        return self.coordinator.last_result

    def submit(self, arrays: dict, feed: Feed | None = None) -> None:
        self.coordinator.submit(arrays, feed)

    def collect(self) -> np.ndarray:
        return self.coordinator.collect()

    def idle(self, wake: threading.Event) -> None:
        wake.wait(IDLE_SECONDS)
        self.coordinator.idle()

    def step_stats(self) -> dict:
        return dict(self.coordinator.last_step)

    def close(self, failed: bool = False) -> None:
        if not self.closed:
            self.closed = True
            self.coordinator.stop(failed)
