"""The generation loop: requests in, a step at a time through the scheduler and the ranks'
graph, tokens out.

Synchronous (`execute`: one Worker in process, or any callable from plan arrays to tokens): plan a
step, run it, take its tokens, plan the next. Run ahead (`ahead`: launch/ranks.py's Ranks, with
submit and collect): step n + 1 is planned and submitted while the ranks run step n, the tokens
step n samples feeding step n + 1 on the ranks (feed.py); then step n's tokens are collected. A
sequence that step n ends (EOS, a stop string the caller finds, a cancel) is in step n + 1 already:
that step's token for it is dropped, and the KV slot it writes is in blocks the sequence has freed,
written before any later step can read them (the ranks run steps in order, and a slot is always
written before it is read). A length limit is known before it is reached, so costs no step."""

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from radiance.config import Config

from .kv_blocks import BlockManager
from .output_text import OutputText
from .scheduler import Scheduler, StepPlan
from .sequence import SamplingParams, Sequence
from .step_plan import plan_arrays
from .text import TextCodec


@dataclass
class Submitted:
    """A step on the ranks: its plan, and where each sequence it samples finds its token."""
    plan: StepPlan
    samples: dict = field(default_factory=dict)  # sequence -> index in the step's tokens


class Engine:
    def __init__(self, config: Config, execute: Callable, text: TextCodec, ahead=None, limits=None):
        """`ahead`: what runs steps ahead (submit(arrays, feed), collect() -> tokens); None: `execute`
        runs each step as it is planned. `limits`: (tokens, sequences), the largest step the ranks'
        rows serve (Ranks.step_limits), below config's where the rows' parameter roles cut it."""
        self.config, self.execute, self.text = config, execute, text
        self.blocks = BlockManager(config.num_blocks, config.block_size)
        tokens, seqs = limits or (config.max_step_tokens, config.max_seqs)
        self.scheduler = Scheduler(self.blocks, min(tokens, config.max_step_tokens), min(seqs, config.max_seqs),
                                   config.max_context)
        self._ids = itertools.count()
        self.run_ahead = ahead is not None
        # Every plan goes through `submit` and every result through `collect` (a caller may wrap
        # them: the server counts step shapes); synchronous, collect runs `execute` on the plan held.
        self.submit, self.collect = (ahead.submit, ahead.collect) if ahead is not None else (self._hold, self._run)
        self._held = None
        self.in_flight: Submitted | None = None  # run ahead: the step submitted and not yet collected

    def add(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        sequence = Sequence(next(self._ids), list(prompt_ids), params)
        self.scheduler.add(sequence)
        return sequence

    def cancel(self, sequence: Sequence) -> None:
        self.scheduler.finish(sequence, "cancelled")

    def step(self) -> list[tuple[Sequence, int]]:
        """One step's tokens: the (sequence, token) pairs it produced. Run ahead, the step after it
        is on the ranks already when this returns."""
        if not self.run_ahead:
            submitted = self._submit(self.scheduler.schedule(), None)
            return self._collect(submitted) if submitted else []
        if self.in_flight is None:
            self.in_flight = self._submit(self.scheduler.schedule(), None)
            if self.in_flight is None:
                return []
        # the ranks run in_flight; the next step is planned with its samples pending meanwhile
        current, self.in_flight = self.in_flight, self._submit(self.scheduler.schedule(), self.in_flight)
        produced = self._collect(current)
        self.settle()
        return produced

    def settle(self) -> None:
        """With nothing left to run, collect the step still in flight, if any: every sequence in it
        has ended (an EOS, a stop string, a cancel), so its tokens are dropped, and the ranks hold
        no step another engine over them would take for its own."""
        if self.in_flight is not None and not self.scheduler.has_work:
            submitted, self.in_flight = self.in_flight, None
            self._collect(submitted)

    def _submit(self, plan: StepPlan, previous: Submitted | None) -> Submitted | None:
        if not plan.chunks:
            return None
        arrays, feed = plan_arrays(plan, self.blocks, self.config.max_blocks, previous.samples if previous else None)
        sampling = [chunk.samples for chunk in plan.chunks]
        self.submit(arrays, feed)
        submitted = Submitted(plan)
        # From here the step's k/v are as good as in the cache: no later step runs before it.
        for index, (chunk, samples) in enumerate(zip(plan.chunks, sampling)):
            chunk.sequence.num_computed = chunk.start + chunk.count
            if samples:
                chunk.sequence.pending += 1
                submitted.samples[chunk.sequence] = index
        return submitted

    def _collect(self, submitted: Submitted) -> list[tuple[Sequence, int]]:
        tokens = self.collect()
        produced = []
        for sequence, index in submitted.samples.items():
            if sequence.finished:
                continue  # ended while this step ran (its pending count went with it): dropped
            token = int(tokens[index])
            sequence.pending -= 1
            sequence.output_ids.append(token)
            produced.append((sequence, token))
            self._check_finished(sequence, token)
        return produced

    def _hold(self, arrays: dict, feed) -> None:
        assert feed is None, "a synchronous step has nothing in flight to feed from"
        self._held = arrays

    def _run(self):
        arrays, self._held = self._held, None
        return self.execute(arrays)

    def _check_finished(self, sequence: Sequence, token: int) -> None:
        params = sequence.params
        if token in self.text.stop_ids and not params.ignore_eos:
            self.scheduler.finish(sequence, "stop")
        elif len(sequence.output_ids) >= params.max_tokens or \
                len(sequence.prompt_ids) + len(sequence.output_ids) >= self.config.max_context:
            self.scheduler.finish(sequence, "length")

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[str]:
        """The completion's text as it arrives, for one request. Text that could begin a stop
        string is held back until it is known not to; the stop string itself is never emitted."""
        sequence = self.add(prompt_ids, params)
        output = OutputText(self.text, params)
        try:
            while not sequence.finished:
                piece = "".join(output.push(token) for produced, token in self.step() if produced is sequence)
                if output.stopped:
                    if not sequence.finished:
                        self.scheduler.finish(sequence, "stop")
                    yield piece
                    return
                if piece:
                    yield piece
            rest = output.rest()
            if rest:
                yield rest
        finally:
            if not sequence.finished:
                self.cancel(sequence)
            self.settle()
