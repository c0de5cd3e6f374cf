"""The generation loop: requests in, a step at a time through the scheduler and the ranks'
graph, tokens out. `execute` is one Worker in process (TP 1) or a coordinator's broadcast."""

import itertools
from collections.abc import Callable, Iterator

from .kv_blocks import BlockManager
from .options import EngineOptions
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence
from .step_plan import plan_arrays
from .text import Detokenizer, TextCodec


class Engine:
    def __init__(self, options: EngineOptions, execute: Callable, text: TextCodec):
        self.options, self.execute, self.text = options, execute, text
        self.blocks = BlockManager(options.num_blocks, options.block_size)
        self.scheduler = Scheduler(self.blocks, options.max_step_tokens, options.max_seqs, options.max_context)
        self._ids = itertools.count()

    def add(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        sequence = Sequence(next(self._ids), list(prompt_ids), params)
        self.scheduler.add(sequence)
        return sequence

    def cancel(self, sequence: Sequence) -> None:
        self.scheduler.finish(sequence, "cancelled")

    def step(self) -> list[tuple[Sequence, int]]:
        """One step; the (sequence, token) pairs it produced."""
        plan = self.scheduler.schedule()
        if not plan.chunks:
            return []
        tokens = self.execute(plan_arrays(plan, self.blocks, self.options.max_blocks))
        produced = []
        for chunk, token in zip(plan.chunks, tokens):
            sequence = chunk.sequence
            sequence.num_computed = chunk.start + chunk.count
            if not chunk.samples:
                continue
            token = int(token)
            sequence.output_ids.append(token)
            produced.append((sequence, token))
            self._check_finished(sequence, token)
        return produced

    def _check_finished(self, sequence: Sequence, token: int) -> None:
        params = sequence.params
        if token in self.text.stop_ids and not params.ignore_eos:
            self.scheduler.finish(sequence, "stop")
        elif len(sequence.output_ids) >= params.max_tokens or sequence.num_tokens >= self.options.max_context:
            self.scheduler.finish(sequence, "length")

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[str]:
        """The completion's text as it arrives, for one request. Text that could begin a stop
        string is held back until it is known not to; the stop string itself is never emitted."""
        sequence = self.add(prompt_ids, params)
        detokenizer, text, emitted = Detokenizer(self.text), "", 0
        try:
            while not sequence.finished:
                for produced, token in self.step():
                    if produced is sequence and token not in self.text.stop_ids:
                        text += detokenizer.push(token)
                cut = _stop_position(text, params.stop)
                if cut is not None:
                    self.scheduler.finish(sequence, "stop")
                    yield text[emitted:cut]
                    return
                safe = len(text) - _pending_prefix(text, params.stop)
                if safe > emitted:
                    yield text[emitted:safe]
                    emitted = safe
            if len(text) > emitted:
                yield text[emitted:]
        finally:
            if not sequence.finished:
                self.cancel(sequence)


def _stop_position(text: str, stops: tuple[str, ...]) -> int | None:
    positions = [text.find(stop) for stop in stops if stop and stop in text]
    return min(positions) if positions else None


def _pending_prefix(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest end of `text` that is the start of a stop string."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:length]):
                longest = length
                break
    return longest
