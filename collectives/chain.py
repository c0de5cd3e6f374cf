"""Chain records: how an `r4dchain` row waits in its own prologue instead of behind a barrier.

In C the engine writes a RAD_CHAIN_REC_BYTES (32-byte) record at RAD_CHAIN_KARG_OFF of the row's
kernel arguments: the address of the word to wait on, the value, the address of the word to bump,
the value (`*wait_word >= wait_value` before the body, `*bump_word = bump_value` after). In Python
`RadArgs.chain` is a `radiance.abi.RadChainRec` whose two word fields hold one-element uint64 numpy
views instead of addresses (the value fields are ints); `chain_record` builds one.

The host meaning: an `r4dchain` collective first publishes its own contribution (its peers can
start on it at once), then waits in its prologue for the chain's wait word (say, the completion word
of the launch it depends on) before it reduces, and bumps the bump word when it is done.

The words live in shared memory, `rad.<run>.chain.<rank>`, one cache line apart, so another process
(a peer rank, a copy engine, a test) can bump them.
"""

from __future__ import annotations

import numpy as np

from radiance.abi import RAD_CHAIN_REC_BYTES, RadChainRec

from .shm import PAGE, Segment, round_up

KIND = "chain"
WORD_STRIDE = 64
assert RAD_CHAIN_REC_BYTES == 32  # four uint64: wait word, wait value, bump word, bump value


def _word(view) -> np.ndarray:
    if not (isinstance(view, np.ndarray) and view.dtype == np.uint64 and view.shape == (1,)):
        raise TypeError("a chain word is a one-element uint64 numpy view")
    return view


def chain_record(wait_word, wait_value: int, bump_word, bump_value: int) -> RadChainRec:
    """The Python form of a RadChainRec: word fields are one-element uint64 views."""
    return RadChainRec(wait_word=_word(wait_word), wait_value=int(wait_value),
                       bump_word=_word(bump_word), bump_value=int(bump_value))


def set_chain(args, record: RadChainRec):
    """Place the record where RadArgs.chain points; returns the args."""
    args.chain = record
    return args


class ChainWords:
    """A rank's chain words in shared memory (`count` of them), or in process memory with `local`."""

    def __init__(self, words: np.ndarray, segment: Segment | None = None):
        self.words, self.segment = words, segment

    @classmethod
    def create(cls, run_id: str, rank: int, count: int = 64) -> "ChainWords":
        segment = Segment.create(run_id, KIND, rank, round_up(count * WORD_STRIDE, PAGE))
        return cls(segment.words(0, count, WORD_STRIDE), segment)

    @classmethod
    def attach(cls, run_id: str, rank: int) -> "ChainWords":
        segment = Segment.attach(run_id, KIND, rank)
        return cls(segment.words(0, segment.size // WORD_STRIDE, WORD_STRIDE), segment)

    @classmethod
    def local(cls, count: int = 64) -> "ChainWords":
        return cls(np.zeros(count * (WORD_STRIDE // 8), np.uint64)[:: WORD_STRIDE // 8])

    def __len__(self) -> int:
        return len(self.words)

    def word(self, i: int) -> np.ndarray:
        """Word i as a one-element uint64 view (what a RadChainRec holds)."""
        if not 0 <= i < len(self.words):
            raise IndexError(f"chain word {i} of {len(self.words)}")
        return self.words[i:i + 1]

    def record(self, wait: int, wait_value: int, bump: int, bump_value: int) -> RadChainRec:
        """A record waiting on word `wait` >= wait_value and bumping word `bump` to bump_value."""
        return chain_record(self.word(wait), wait_value, self.word(bump), bump_value)

    def close(self, unlink: bool | None = None) -> None:
        if self.segment is not None:
            self.words = np.zeros(0, np.uint64)
            self.segment.close()
            if self.segment.owner if unlink is None else unlink:
                self.segment.unlink()
            self.segment = None
