"""Continuous batching: each step takes every running sequence's next tokens (one for a decode,
a chunk for a prefill) up to the step's token budget, then admits waiting sequences whose prompt
fits in the free KV blocks. A long prefill is cut into chunks of the budget, which is the largest
extent the graph's RAD_PROLE_SEQ_CHUNK parameter was resolved for, and a step holds at most the
sequences its RAD_PROLE_CAPACITY bound allows (engine/selection/step_limits.py: the Engine hands
both over as max_tokens and max_seqs)."""

from collections import deque
from dataclasses import dataclass

from .kv_blocks import BlockManager
from .sequence import Sequence


@dataclass
class Chunk:
    sequence: Sequence
    start: int  # first position computed this step
    count: int

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the sequence's last known token, so its sample is kept."""
        return self.start + self.count == self.sequence.num_tokens


@dataclass
class StepPlan:
    chunks: list[Chunk]

    @property
    def tokens(self) -> int:
        return sum(chunk.count for chunk in self.chunks)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_tokens: int, max_seqs: int, max_context: int):
        self.blocks, self.max_tokens, self.max_seqs, self.max_context = blocks, max_tokens, max_seqs, max_context
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, sequence: Sequence) -> None:
        if not sequence.prompt_ids:
            raise ValueError("the prompt is empty")
        if len(sequence.prompt_ids) >= self.max_context:
            raise ValueError(f"the prompt is {len(sequence.prompt_ids)} tokens, the context holds {self.max_context}")
        if self.blocks.blocks_for(len(sequence.prompt_ids) + 1) > self.blocks.num_blocks:
            raise ValueError(f"the prompt is {len(sequence.prompt_ids)} tokens, more than the KV cache holds")
        self.waiting.append(sequence)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self) -> None:
        """Free the newest sequence's blocks; it recomputes from the start when readmitted."""
        victim = self.running.pop()
        self.blocks.free(victim)
        victim.num_computed = 0
        self.waiting.appendleft(victim)

    def settled(self, sequence: Sequence) -> bool:
        """Whether a token in flight is certain to end the sequence (its max_tokens or the context),
        so it is not planned again: run ahead costs no discarded step for a length limit."""
        return bool(sequence.pending) and (sequence.num_outputs >= sequence.params.max_tokens
                                           or sequence.num_tokens >= self.max_context)

    def schedule(self) -> StepPlan:
        chunks, budget = [], self.max_tokens
        for sequence in list(self.running):
            if budget == 0:
                break
            if sequence not in self.running or self.settled(sequence):
                continue  # preempted below, or ending with the step in flight
            count = min(sequence.num_tokens - sequence.num_computed, budget)
            while not self.blocks.can_allocate(sequence, sequence.num_computed + count):
                if self.running[-1] is sequence and len(self.running) == 1:
                    raise MemoryError(f"sequence {sequence.id} cannot grow: the KV cache is full")
                self._preempt()
                if sequence not in self.running:
                    break
            if sequence not in self.running:
                continue
            self.blocks.allocate(sequence, sequence.num_computed + count)
            chunks.append(Chunk(sequence, sequence.num_computed, count))
            budget -= count
        while self.waiting and budget and len(self.running) < self.max_seqs:
            sequence = self.waiting[0]
            if self.settled(sequence):
                break  # preempted with its last token in flight: it ends when that token comes
            if not self.blocks.can_allocate(sequence, sequence.num_tokens + 1):
                break
            self.waiting.popleft()
            self.running.append(sequence)
            count = min(sequence.num_tokens, budget)
            self.blocks.allocate(sequence, count)
            chunks.append(Chunk(sequence, 0, count))
            budget -= count
        return StepPlan(chunks)

    def finish(self, sequence: Sequence, reason: str) -> None:
        sequence.finish_reason = sequence.finish_reason or reason
        sequence.pending = 0  # what a step in flight samples for it is dropped when that step comes back
        if sequence in self.running:
            self.running.remove(sequence)
        elif sequence in self.waiting:
            self.waiting.remove(sequence)
        self.blocks.free(sequence)
