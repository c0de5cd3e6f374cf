"""Speculative decoding with a draft model (Leviathan et al., Chen et al.: speculative sampling).
Each round, a draft model proposes k tokens for every decoding sequence, one draft step at a time
(the op mtp_couple_propose turns each step's draft logits into a token and its distribution q);
the target model then computes all k + 1 positions (the last known token and the k drafts) in one
step, and mtp_couple_verify keeps the drafts it agrees with, by rejection against q, and adds one
token of its own. A round gives 1 to k + 1 tokens a sequence, distributed exactly as the target's
own sampling (greedy at temperature 0: the very tokens it would pick).

Both models share the KV blocks (one BlockManager, so the same block tables and slots; each model
has its own cache). A prefill, an admission, or anything a round cannot take (no room for k more
positions) is a plain step of the base Engine, run by both models on the same plan; the draft
catches up first where a round left it a token behind. Rounds are synchronous (no run ahead).
top_k and top_p are not applied in a round: requests are refused them up front (the ops sample the
whole distribution at the temperature).

Where the drafts come from is `_drafts` (a round's k drafts and their q) and `_verified` (what the
round kept), with the plain steps: here a draft model's; mtp.py's MtpEngine overrides them for a
model's own MTP heads.

The models and ops come in as callables (launch/speculative.py wires them): `execute(arrays)` the
target's step (tokens), `logits()` the logits of the target's last step's sampled rows,
`draft(arrays)` the draft's step (its logits), `propose(logits, temperature, rng)` -> (tokens, q),
`verify(logits, drafts, q, temperature, rng)` -> (tokens [S, k+1], accepted [S])."""

from collections.abc import Callable

import numpy as np

from radiance.config import Config

from .engine import Engine
from .scheduler import Scheduler
from .sequence import SamplingParams, Sequence
from .speculative_plan import Entry, speculative_arrays
from .text import TextCodec


class SpeculativeEngine(Engine):
    def __init__(self, config: Config, execute: Callable, text: TextCodec, *, max_seqs: int, draft: Callable,
                 logits: Callable, propose: Callable, verify: Callable):
        """`config` is the model's ranks' (their max_seqs holds a verify step's rows); `max_seqs` the
        sequences decoded together."""
        super().__init__(config, execute, text)
        self.k = config.draft_tokens
        self.scheduler = Scheduler(self.blocks, config.max_step_tokens, max_seqs, config.max_context)
        self.draft, self.logits, self.propose, self.verify = draft, logits, propose, verify
        self.drafted: dict[Sequence, int] = {}  # positions the draft's cache holds, a sequence
        self._with_draft = False
        self.rounds = self.accepted = 0  # rounds run, and draft tokens the target kept

    def add(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        if params.top_k or params.top_p < 1:
            raise ValueError("speculative decoding (--draft-model) samples the whole distribution at the "
                             "temperature: top_k and top_p are not supported with it")
        return super().add(prompt_ids, params)

    # ---- plain steps: both models, one plan ------------------------------------------------------
    def _run(self):
        if self._with_draft:
            self.draft(self._held)
        return super()._run()

    def _submit(self, plan, previous):
        submitted = super()._submit(plan, previous)
        for chunk in plan.chunks:
            self.drafted[chunk.sequence] = chunk.start + chunk.count
        return submitted

    def _plain_step(self) -> list:
        behind = [s for s in self.scheduler.running if self.drafted.get(s, 0) < s.num_computed]
        if behind:  # a round that kept every draft left the draft one position short
            self._draft_only([Entry(s, self.drafted[s], s.token_ids[self.drafted[s]:s.num_computed]) for s in behind])
        self._with_draft = True
        try:
            produced = super().step()
        finally:
            self._with_draft = False
        self._forget_finished()
        return produced

    def _draft_only(self, entries: list[Entry]) -> np.ndarray:
        logits = self.draft(speculative_arrays(entries, self.blocks, self.config.max_blocks, every=False))
        for entry in entries:
            self.drafted[entry.sequence] = entry.start + len(entry.ids)
        return logits

    # ---- rounds ----------------------------------------------------------------------------------
    def _round_possible(self) -> bool:
        running, k = self.scheduler.running, self.k
        if not running or (self.scheduler.waiting and len(running) < self.scheduler.max_seqs):
            return False
        if any(s.num_computed != s.num_tokens - 1 or s.num_tokens + k > self.config.max_context for s in running):
            return False
        needed = sum(max(0, self.blocks.blocks_for(s.num_tokens + k) - len(s.blocks)) for s in running)
        return needed <= len(self.blocks.free_blocks)

    def step(self) -> list[tuple[Sequence, int]]:
        return self._round() if self._round_possible() else self._plain_step()

    def _round(self) -> list[tuple[Sequence, int]]:
        sequences, k = list(self.scheduler.running), self.k
        count = len(sequences)
        for sequence in sequences:
            self.blocks.allocate(sequence, sequence.num_tokens + k)
        temperature = np.array([s.params.temperature for s in sequences], np.float32)
        drafts, q = self._drafts(sequences, temperature)
        entries = [Entry(s, s.num_tokens - 1, [s.token_ids[-1], *drafts[i].tolist()]) for i, s in enumerate(sequences)]
        self.submit(speculative_arrays(entries, self.blocks, self.config.max_blocks, every=True), None)
        self.collect()
        rng = np.array([(s.params.seed, s.num_outputs) for s in sequences], np.uint64)
        tokens, accepted = self.verify(self.logits(), drafts, q.reshape(count * k, -1), temperature, rng)
        self.rounds += 1
        produced, given = [], []
        for s, sequence in enumerate(sequences):
            given.append(int(accepted[s]))
            self.accepted += given[-1] - 1
            last = sequence.num_tokens - 1
            sequence.num_computed = last + given[-1]  # the last known token and the drafts kept are cached
            for token in tokens[s, :given[-1]].tolist():
                sequence.output_ids.append(token)
                produced.append((sequence, token))
                self._check_finished(sequence, token)
                if sequence.finished:
                    break
        self._verified(sequences, given)
        self._forget_finished()
        return produced

    def _drafts(self, sequences: list[Sequence], temperature: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the k drafts [S, k] i32, their distributions q [S, k, vocab] f32): k draft steps."""
        count, k = len(sequences), self.k
        drafts = np.zeros((count, k), np.int32)
        q = None
        for j in range(k):
            entries = []
            for s, sequence in enumerate(sequences):
                known = sequence.token_ids + drafts[s, :j].tolist()
                entries.append(Entry(sequence, self.drafted[sequence], known[self.drafted[sequence]:]))
            tokens, probs = self.propose(self._draft_only(entries), temperature, self._draft_rng(sequences, j))
            drafts[:, j] = tokens
            if q is None:
                q = np.zeros((count, k, probs.shape[1]), np.float32)
            q[:, j] = probs
        return drafts, q

    def _draft_rng(self, sequences: list[Sequence], j: int) -> np.ndarray:
        """Draft j's counters: no other round's draft uses them (rounds start at distinct output counts)."""
        return np.array([(s.params.seed, s.num_outputs * (self.k + 1) + j) for s in sequences], np.uint64)

    def _verified(self, sequences: list[Sequence], given: list[int]) -> None:
        """After a round's verify: sequence i kept given[i] tokens (the drafts kept and one of the
        model's), output already; its positions up to num_computed are the model's own."""
        for sequence in sequences:  # the draft's cache is good up to the last draft kept
            self.drafted[sequence] = min(self.drafted[sequence], sequence.num_computed)

    def _forget_finished(self) -> None:
        for sequence in [s for s in self.drafted if s.finished]:
            del self.drafted[sequence]
