"""Where a rank finds the tokens of the step before for a step's feed (run ahead, generation/feed.py)
when it runs steps in micro-batches or as a pipeline stage: the tokens it sampled itself (every
rank of the last stage, and every rank without stages, samples the same ones), or, on the first
stage, the messages of the last stage's token pipe (collectives/token_pipe.py), one a micro-batch,
taken only as far as a part's feed needs them, so the first stage starts part i of step n + 1 as
soon as the last stage has sampled part i of step n. A stage between the two has no use for ids
(only the first embeds them): it feeds from its own, unsampled tokens."""

from __future__ import annotations

import numpy as np

from radiance.collectives.token_pipe import TokenPipe


class FedTokens:
    def __init__(self, pipe: TokenPipe | None = None, refusal: str | None = None):
        """`refusal`: why this rank cannot be fed (a first stage without a token pipe)."""
        self.pipe, self.refusal = pipe, refusal
        self.tokens = np.zeros(0, np.int32)  # the last step's, by sequence
        self.known = np.zeros(0, bool)
        self.owed = 0  # messages of the last step not yet taken from the pipe

    def __len__(self) -> int:
        return len(self.tokens)

    def __call__(self, sources: np.ndarray) -> np.ndarray:
        """The last step's tokens at `sources`, waiting for the messages that hold them."""
        if self.refusal is not None:
            raise RuntimeError(self.refusal)
        while not self.known[sources].all():
            if self.owed == 0:
                raise RuntimeError(f"a feed reads tokens {sources[~self.known[sources]].tolist()} that the last "
                                   "stage did not send")
            self._take()
        return self.tokens[sources]

    def _take(self) -> None:
        pairs = self.pipe.recv()
        self.owed -= 1
        self.tokens[pairs[:, 0]], self.known[pairs[:, 0]] = pairs[:, 1], True

    def ran(self, tokens: np.ndarray, parts: int) -> None:
        """A step ran, in `parts` parts, this rank sampling `tokens`: the last step's messages not
        taken yet are taken now (so at most two steps' are ever in flight), then this step's are owed."""
        while self.owed:
            self._take()
        if self.pipe is None:
            self.tokens, self.known = tokens, np.ones(len(tokens), bool)
            return
        self.tokens, self.known, self.owed = np.zeros(len(tokens), np.int32), np.zeros(len(tokens), bool), parts
