"""N rank processes (`radiance-launch`, or `radiance --tp N`): one per visible card, or host ranks
where there is none, started, shaken hands with and supervised by a Coordinator in this process."""

from __future__ import annotations

import os
import threading

import numpy as np

from radiance.abi import RAD_PLUGIN_ARCH
from radiance.config import Config, ConfigError, flag
from radiance.engine.loading.model import open_model
from radiance.engine.loading.registry import Registry
from radiance.engine.selection.shard import ShardError, check_split
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


def check_before_spawning(config: Config) -> None:
    """What every rank would find wrong, found once, before any starts: the model opens (its small
    planes checked), its architecture's plugin declares it, and the graph splits over config.tp
    ranks. (A rank's own failure would be printed by each rank, then by this one.) Only the
    architecture plugins are opened: the kernel libraries are the ranks' to load (libr4d builds its
    native half on first load), so this process never builds or maps one."""
    registry = Registry(config.radiance_home, kinds=(RAD_PLUGIN_ARCH,))
    try:
        model = open_model(config, registry)
        try:
            check_split(model.graph, model.weights, config.tp)
        except ShardError as error:
            raise ShardError(f"{config.model} does not split over --tp {config.tp}: {error}") from None
        finally:
            model.close()
    finally:
        registry.close()


class LaunchedRanks(Ranks):
    def __init__(self, config: Config):
        local = config.world // config.nnodes  # this node's ranks
        cards = choose_cards(local) if config.nnodes == 1 else []  # over nodes: host ranks (docs/RUNTIME.md)
        check_before_spawning(config)
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
        self.step_limits = agreement.step_limits
        same_host = bool(self.facts.get("device.same_host", 1))
        self.run_ahead = run_ahead_default(config, card=bool(cards), same_host=same_host)
        if self.run_ahead and config.pp > 1 and not same_host:
            self.coordinator.stop(failed=True)
            raise ConfigError(f"{flag('run_ahead')}: the pipeline stages are not on one host (device.same_host = 0), "
                              "and the last stage's tokens reach the first through shared memory")
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
