"""Run ahead: the ids of a step that the step before it samples. While the ranks run step n the
engine plans step n + 1, before step n's tokens are known to it; a position whose id is such a
token carries a placeholder in the plan, and the feed says where the rank finds it: in the tokens
step n sampled, in the rank's own memory (the card's token buffer, copied on the stream, or the
host executor's), never through the coordinator.

    ids[targets[i]] = tokens of the previous step[sources[i]]

The previous step is the one each rank ran just before: every rank runs every step, in order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PLACEHOLDER = 0  # the id a plan carries where the feed writes one: a valid id, so a rank never indexes past the table


class FeedError(ValueError):
    """A feed that does not fit the step it feeds or the step it takes from; one line."""


@dataclass(slots=True)
class Feed:
    # Python ints, not numpy arrays, and a plain (not frozen) dataclass: a rank takes a feed out of
    # every run-ahead plan, on caches a step has just flushed (docs/RUNTIME.md)
    targets: tuple[int, ...]  # positions in this step's ids
    sources: tuple[int, ...]  # indices into the previous step's sampled tokens (one token per sequence)

    @classmethod
    def of(cls, pairs: list[tuple[int, int]]) -> "Feed | None":
        """The feed of (target, source) pairs; None when there are none."""
        if not pairs:
            return None
        targets, sources = zip(*pairs)
        return cls(tuple(int(t) for t in targets), tuple(int(s) for s in sources))

    def check(self, ids: int, tokens: int) -> None:
        """Refuse a feed that writes past this step's `ids` or reads past the previous step's `tokens`."""
        if len(self.targets) != len(self.sources):
            raise FeedError(f"a feed of {len(self.targets)} targets and {len(self.sources)} sources")
        if self.targets and not (0 <= min(self.targets) and max(self.targets) < ids):
            raise FeedError(f"a feed writes id {max(self.targets)} of a step of {ids} tokens")
        if self.sources and not (0 <= min(self.sources) and max(self.sources) < tokens):
            raise FeedError(f"a feed reads token {max(self.sources)} of a step that sampled {tokens}")

    def apply(self, ids: np.ndarray, tokens: np.ndarray) -> None:
        """On the host: the ids from the tokens, both this process's memory (int32, contiguous)."""
        into, out_of = memoryview(ids), memoryview(tokens)
        for target, source in zip(self.targets, self.sources):
            into[target] = out_of[source]

    def runs(self) -> list[tuple[int, int, int]]:
        """(target, source, count) runs where both advance by one: a decode batch whose sequences
        are the previous step's, in order, is one run, so one copy on a card."""
        out = []
        for target, source in zip(self.targets, self.sources):
            if out and out[-1][0] + out[-1][2] == target and out[-1][1] + out[-1][2] == source:
                out[-1] = (out[-1][0], out[-1][1], out[-1][2] + 1)
            else:
                out.append((target, source, 1))
        return out
