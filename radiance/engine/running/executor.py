"""What runs one rank's resolved graph, step after step: one small interface (vLLM v1's one executor
interface) and one implementation a domain, each in a file of its own (tinygrad's one file a
backend): host.py on the host, device.py on a card (the fake card too). The Worker writes a step's
inputs into `inputs`, calls `run`, reads the sampled tokens back out of `inputs`, and never asks
which executor it has; `open_executor` (this package's face) is the one place that chooses."""

from __future__ import annotations

import abc
from collections import OrderedDict, defaultdict

import numpy as np

from radiance.abi import RAD_LINK_ENDED, RAD_OK, RadTensor
from radiance.engine.selection.resolve import Launch, ResolvedGraph

from .rank_weights import RankWeights
from .step_inputs import StepInputs

MAX_CACHED_SHAPES = 64  # (tokens, seqs) shapes whose launch plans are kept; decode reuses a handful


class ShapePlans:
    """Launch plans by step shape (tokens, seqs), built on first use; past MAX_CACHED_SHAPES the one
    used longest ago is dropped. A server's steps change shape as requests arrive, prefill in chunks
    beside the decodes and finish, so new shapes keep coming: dropping every plan at once when the
    cache filled made the few hot decode shapes rebuild with the cold ones (SmolLM2's 366 launches:
    9 ms a plan on the 2-core host)."""

    def __init__(self, limit: int = MAX_CACHED_SHAPES):
        self.limit = limit
        self.built = 0  # plans built in all: the misses (tests/test_executor_plans.py counts them)
        self._plans: OrderedDict = OrderedDict()

    def get(self, key: tuple, build):
        """The plan of `key`, from build() the first time (and again once dropped)."""
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = build()
            self.built += 1
            if len(self._plans) > self.limit:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        return plan

    def __len__(self) -> int:
        return len(self._plans)


class StepError(RuntimeError):
    """A row returned an error: names the node, the row and the code."""


def check_status(launch: Launch, row, status: int) -> None:
    """RAD_OK, or RAD_LINK_ENDED from a colour-2 row; anything else fails the step, naming the node."""
    if status not in (RAD_OK, RAD_LINK_ENDED) or (status == RAD_LINK_ENDED and row.collective != 2):
        raise StepError(f"node '{launch.node.name}': row {row.plugin.name}:{row.name} returned {status}")


class Executor(abc.ABC):
    graph: ResolvedGraph
    weights: RankWeights  # the rank's slice of every weight, as the container holds it
    inputs: StepInputs  # what a step reads (written before `run`), and the tokens it sampled (after)

    def __init__(self):
        self.profile = False  # when set, each op's seconds add to op_seconds (on a card: only with graphs off)
        self.op_seconds = defaultdict(float)

    @abc.abstractmethod
    def weight(self, name: str, band) -> RadTensor:
        """Weight `name` as `band`'s row reads it (the form its layout hook asked for), where the
        row reads it: this process's memory or the card's. Loaded on first use, once."""

    @abc.abstractmethod
    def run(self, tokens: int, seqs: int, feed=None) -> None:
        """One step over `tokens` tokens of `seqs` sequences; its inputs are written already, the
        sampled tokens are in `inputs` after. `feed` (generation/feed.py): ids this step takes from
        the tokens the step before sampled, where that step left them."""

    @abc.abstractmethod
    def read_buffer(self, name: str, rows: int) -> np.ndarray:
        """A buffer's first rows, after a step (a debugging aid: the logits, say)."""

    @abc.abstractmethod
    def write_buffer(self, name: str, rows: np.ndarray) -> None:
        """A buffer's first rows, before a step (what the engine hands a graph besides the step
        inputs: a model's hidden state for its MTP heads, rad_arch.h)."""

    @abc.abstractmethod
    def release(self) -> None:
        """Every row's instance finished and every allocation given back."""
