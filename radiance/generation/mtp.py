"""Speculative decoding with the model's own multi-token-prediction heads (rad_arch.h,
RAD_MTP_SUFFIX) as the draft: SpeculativeEngine's rounds (verify, acceptance, its ops) with drafts
from the heads instead of a second model. As vLLM's MTP proposer does for DeepSeek-V3:

- After every step of the model, the heads run over the same positions: row i takes the model's
  hidden state at position i (its RAD_HIDDEN, handed back by the ranks) and the token after
  position i (one ahead of the step's ids: the next prompt token, or the token just sampled), so
  their own KV cache follows the model's, and each sequence's last row gives the logits of the token
  after the one just sampled: the round's first draft. After a round's verify step the positions
  are those the model kept (the last known token and the drafts kept), the token after the last one
  the model's own.
- A round's further drafts are one-row steps of the heads, each taking the heads' own hidden state
  of the row before (RAD_MTP_HIDDEN) with the draft just made (one head, reused for every draft).
  The cache rows they write past the model's are rewritten by the catch-up after verify before any
  step reads them (a step reads no position it has not written).

Prefills, admissions and whatever a round cannot take are plain steps of the model, each followed
by the heads' step. A batch in which some sequence asks for top_k or top_p decodes with plain steps
(a round samples the whole distribution at the temperature).

`heads(arrays, previous)` runs one step of the heads (previous: f32 [tokens, hidden]) and gives
(logits, hidden) of its sampled rows; `hidden()` the model's RAD_HIDDEN rows of its last step."""

from collections.abc import Callable

import numpy as np

from radiance.abi import RAD_STEP_IDS
from radiance.config import Config

from .engine import Engine
from .sequence import SamplingParams, Sequence
from .speculative import SpeculativeEngine
from .speculative_plan import Entry, speculative_arrays
from .text import TextCodec


class MtpEngine(SpeculativeEngine):
    def __init__(self, config: Config, execute: Callable, text: TextCodec, *, max_seqs: int, heads: Callable,
                 hidden: Callable, logits: Callable, propose: Callable, verify: Callable):
        super().__init__(config, execute, text, max_seqs=max_seqs, draft=None, logits=logits, propose=propose,
                         verify=verify)
        self.heads, self.hidden = heads, hidden
        # a sequence -> (logits, hidden) of the heads' row at its last computed position: its next
        # round's first draft, and the hidden state the second draft starts from
        self.ready: dict[Sequence, tuple[np.ndarray, np.ndarray]] = {}
        self._arrays = self._submitted = None

    def add(self, prompt_ids: list[int], params: SamplingParams) -> Sequence:
        return Engine.add(self, prompt_ids, params)  # top_k / top_p: plain steps (_round_possible)

    # ---- plain steps: the model's, then the heads' over the same positions ----------------------
    def _run(self):
        self._arrays = self._held
        return Engine._run(self)

    def _submit(self, plan, previous):
        self._submitted = Engine._submit(self, plan, previous)
        return self._submitted

    def _plain_step(self) -> list:
        self._submitted = None
        produced = Engine.step(self)
        submitted, arrays = self._submitted, self._arrays
        self._submitted = self._arrays = None
        if submitted is not None:
            ids = arrays[RAD_STEP_IDS].copy()
            offset = 0
            for chunk in submitted.plan.chunks:  # row i takes the token after position i
                ahead = chunk.sequence.token_ids[chunk.start + 1:chunk.start + chunk.count + 1]
                ids[offset:offset + len(ahead)] = ahead  # short only for a sequence that ended: its row is unused
                offset += chunk.count
            logits, hidden = self.heads({**arrays, RAD_STEP_IDS: ids}, self.hidden())
            for sequence, index in submitted.samples.items():
                self.ready[sequence] = (logits[index], hidden[index])
        self._forget_finished()
        return produced

    # ---- rounds ----------------------------------------------------------------------------------
    def _round_possible(self) -> bool:
        running = self.scheduler.running
        if any(s not in self.ready or s.params.top_k or s.params.top_p < 1 for s in running):
            return False
        return super()._round_possible()

    def _drafts(self, sequences: list[Sequence], temperature: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        count, k = len(sequences), self.k
        drafts = np.zeros((count, k), np.int32)
        logits = np.stack([self.ready[s][0] for s in sequences])
        hidden = np.stack([self.ready[s][1] for s in sequences])
        q = None
        for j in range(k):
            if j:  # draft j from the heads' row at position N - 2 + j: draft j - 1 and the heads' own hidden state
                entries = [Entry(s, s.num_tokens - 2 + j, [int(drafts[i, j - 1])]) for i, s in enumerate(sequences)]
                logits, hidden = self.heads(speculative_arrays(entries, self.blocks, self.config.max_blocks,
                                                               every=False), hidden)
            tokens, probs = self.propose(logits, temperature, self._draft_rng(sequences, j))
            drafts[:, j] = tokens
            if q is None:
                q = np.zeros((count, k, probs.shape[1]), np.float32)
            q[:, j] = probs
        return drafts, q

    def _verified(self, sequences: list[Sequence], given: list[int]) -> None:
        """The heads over the positions the model kept: the verify step's rows 0 to given - 1 of
        each sequence, each with the token after it."""
        model_hidden, rows = self.hidden(), self.k + 1
        entries, previous = [], []
        for s, sequence in enumerate(sequences):
            self.ready.pop(sequence, None)
            if sequence.finished:
                continue
            first = sequence.num_computed - given[s]  # the round's first position: its last known token's
            entries.append(Entry(sequence, first, sequence.token_ids[first + 1:first + 1 + given[s]]))
            previous.append(model_hidden[s * rows:s * rows + given[s]])
        if not entries:
            return
        logits, hidden = self.heads(speculative_arrays(entries, self.blocks, self.config.max_blocks, every=False),
                                    np.concatenate(previous))
        for index, entry in enumerate(entries):
            self.ready[entry.sequence] = (logits[index], hidden[index])

    def _forget_finished(self) -> None:
        for sequence in [s for s in self.ready if s.finished]:
            del self.ready[sequence]
