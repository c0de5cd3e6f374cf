"""One interface for the ranks behind an Engine, whether one rank runs in this process or N rank
processes were launched: submit a step and collect its tokens (execute: both at once), wait while
idle, the last step's figures, the resolved graph's lines and digest, close. `open_ranks`
(launch/__init__.py) is the one place that chooses between them (the idea of vLLM v1's executor:
one interface, one process or many behind it); the CLIs, the server and the benches go through it
and nothing else.

    with open_ranks(Config(model="smollm2.rad", tp=3)) as ranks:
        engine = engine_over(ranks)
        ...
"""

from __future__ import annotations

import abc
import threading

import numpy as np

from radiance.config import Config
from radiance.generation.feed import Feed
from radiance.generation.text import TextCodec

from .agent import AgentError
from .coordinator import LaunchError
from .nodes import NodeFailed
from .supervisor import RankFailed

# What ends a launch for a reason the user should read in one line (the CLIs report these as they
# report a bad model file): a rank that failed, a node that did, or a launch that cannot go on.
RANK_ERRORS = (RankFailed, NodeFailed, AgentError, LaunchError)


class Ranks(abc.ABC):
    """The ranks of one engine. `config` is what they were opened with, `text` the model's codec."""

    world: int
    digest: str  # the resolved graph's digest, the same on every rank
    lines: list[str]  # rank 0's resolved graph: one "node|op|band|row" line per node and band
    step_limits: tuple[int, int]  # (tokens, sequences): the largest step every rank's rows serve
    config: Config
    text: TextCodec
    last_result: dict  # what rank 0 returned for the last step collected: "tokens", and the return buffer if asked
    run_ahead: bool  # whether engine_over's Engine plans a step while these ranks run the one before

    @abc.abstractmethod
    def submit(self, arrays: dict, feed: Feed | None = None) -> None:
        """Send one step of the plan `arrays` (generation/step_plan.py) to every rank; returns once it
        is on its way. `feed`: ids it takes from the tokens of the step submitted before it, which
        each rank finds in its own memory. At most two steps are submitted and not collected."""

    @abc.abstractmethod
    def collect(self) -> np.ndarray:
        """The sampled tokens of the oldest step submitted and not yet collected (waits for them);
        last_result and step_stats() are that step's from then on."""

    def execute(self, arrays: dict) -> np.ndarray:
        """One step, synchronously: submit, then collect."""
        self.submit(arrays)
        return self.collect()

    @abc.abstractmethod
    def idle(self, wake: threading.Event) -> None:
        """Nothing to run: wait for `wake` (a while at most) and look after the ranks meanwhile."""

    @abc.abstractmethod
    def step_stats(self) -> dict:
        """Rank 0's figures of the last step collected: compute, collectives (seconds; collectives
        with `profile` only), waited (seconds rank 0 spent between its last answer and holding this
        step's plan), gate_holds, gate_hold_s (cumulative), and with `profile` "ops": seconds by op."""

    @abc.abstractmethod
    def close(self, failed: bool = False) -> None:
        """Let go of everything; `failed`: the ranks are not asked to stop politely first."""

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.close(failed=error is not None)


def run_ahead_default(config: Config, card: bool, same_host: bool = True) -> bool:
    """Whether to run ahead when not told: where it was measured to help (docs/RUNTIME.md, "Run
    ahead"), launched host ranks, however many cores. Run ahead, the coordinator plans while the
    ranks compute and a plan's delivery is off the critical path: 37-79 us of rank 0's against
    85-603 us synchronously at TP 1 / 2 / 3 on 2 cores (bench/results/step_latency_host_2026-12-03d.md).
    With a core of its own that is time out of every step (TP 1 launched on 2 cores: 15.5 -> 14.0
    ms); with as many ranks as cores or more (TP 2 and 3 on 2 cores) the coordinator's planning comes
    out of the ranks' time instead, and the step is no slower: 0.98x / 0.99x of synchronous at TP 2 /
    3 (geometric means of 25 alternated pairs each, quiet and loaded). Not in
    process on the host (the engine's planning there is ~0.1 ms of a 13 ms step) nor on a card: on one
    H200 the 8B model's batched decode ran 0.96-0.99x of synchronous at batch 8 / 32 / 64
    (bench/results/h200_card_runs_2026-12-03h.md, `card_batches.py --run-ahead off on`). Pipeline stages on one host (`same_host`:
    device.same_host, the token pipe's condition) run ahead in parts, which keeps both stages busy
    (TP 1 x PP 2 decode 1.6x to 1.75x whole steps' tokens/s on 2 cores, bench/pipeline_overlap.py)."""
    if config.run_ahead is not None:
        return config.run_ahead
    if config.pp > 1:
        return same_host
    if config.micro_batches > 1:  # works (ranks/fed_tokens.py), not measured to help without stages
        return False
    return (config.tp > 1 or config.launched) and not card
