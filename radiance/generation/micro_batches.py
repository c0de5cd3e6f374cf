"""A step's plan cut into micro-batches (pipeline stages, `--pp`): contiguous ranges of its tokens,
near equal, which each rank runs one after another, so that stage s runs micro-batch i while stage
s + 1 runs micro-batch i - 1 (GPipe's schedule within a step; docs/RUNTIME.md, "Pipeline stages").

Every rank cuts the same plan the same way, so the stages agree on each micro-batch's shape. A cut
may fall inside a sequence: its tokens before the cut are a chunk of a chunked prefill (they write
their KV slots, which the later chunk reads, on every stage, before it runs), and only the chunk
that holds the sequence's last token samples a token that is kept. A sampled token depends only on
its sequence's logits and its (seed, counter) pair (RAD_STEP_RNG), never on the other sequences of
the batch, so the tokens are those of the whole step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from radiance.abi import (
    RAD_STEP_CONTEXT_LENS, RAD_STEP_CU_SEQLENS, RAD_STEP_IDS, RAD_STEP_LAST_INDEX, RAD_STEP_POSITIONS, RAD_STEP_SLOTS,
)

# A part has at least this many tokens: a part streams every weight of its stage again, so where a
# step is bound by that (a few sequences decoding) a part of fewer tokens costs nearly what the whole
# step does. Measured (bench/pipeline_overlap.py, TP 1 x PP 2, two parts): decode of 4 sequences
# 0.77x the whole step's tokens/s, of 8 1.02x, of 16 1.35x.
MIN_PART_TOKENS = 4
TOKEN_ROWS = (RAD_STEP_IDS, RAD_STEP_POSITIONS, RAD_STEP_SLOTS)  # one row a token; every other a sequence
DERIVED = (RAD_STEP_CU_SEQLENS, RAD_STEP_CONTEXT_LENS, RAD_STEP_LAST_INDEX)  # rewritten for each part


@dataclass(frozen=True)
class MicroBatch:
    arrays: dict  # the part's plan arrays, as generation/step_plan.py writes a step's
    start: int  # its first token's place in the step's ids
    sequences: np.ndarray  # int: the whole step's sequence each of the part's sequences is a piece of
    kept: np.ndarray  # bool: the pieces whose sampled token is the sequence's (they hold its last token)


def split_plan(arrays: dict, count: int, least: int = MIN_PART_TOKENS) -> list[MicroBatch]:
    """The step's plan in at most `count` micro-batches of near equal tokens, each of at least
    `least` tokens (fewer parts where the step has fewer tokens; one, the whole plan, where it has
    fewer than twice `least`)."""
    bounds = arrays[RAD_STEP_CU_SEQLENS].astype(np.int64)  # [seqs + 1] token offsets of the sequences
    seqs, tokens = len(arrays[RAD_STEP_CONTEXT_LENS]), int(bounds[-1])
    parts = max(1, min(int(count), tokens // least))
    edges = [tokens * k // parts for k in range(parts + 1)]  # token offsets of the parts
    ends = arrays[RAD_STEP_CONTEXT_LENS].astype(np.int64)  # a sequence's context after this step
    batches = []
    for start, stop in zip(edges, edges[1:]):
        # the sequences with a token in [start, stop), each clipped to it
        first = int(np.searchsorted(bounds, start, side="right")) - 1
        last = int(np.searchsorted(bounds, stop, side="left"))  # one past the last sequence
        sequences = np.arange(first, last)
        lo = np.maximum(bounds[first:last], start) - start  # the pieces' offsets in the part
        hi = np.minimum(bounds[first + 1:last + 1], stop) - start
        part = {name: array[start:stop] if name in TOKEN_ROWS else array[first:last]
                for name, array in arrays.items() if name not in DERIVED}
        part[RAD_STEP_CU_SEQLENS] = np.append(lo, hi[-1]).astype(arrays[RAD_STEP_CU_SEQLENS].dtype)
        # a piece ends `dropped` tokens before its sequence's last token of the step
        dropped = bounds[first + 1:last + 1] - (hi + start)
        part[RAD_STEP_CONTEXT_LENS] = (ends[first:last] - dropped).astype(arrays[RAD_STEP_CONTEXT_LENS].dtype)
        part[RAD_STEP_LAST_INDEX] = (hi - 1).astype(arrays[RAD_STEP_LAST_INDEX].dtype)
        batches.append(MicroBatch(part, start, sequences, dropped == 0))
    assert sum(int(batch.kept.sum()) for batch in batches) == seqs  # every sequence's last token in one part
    return batches


def feed_part(batch: MicroBatch, feed, previous) -> None:
    """Write the ids of `feed` (generation/feed.py) that fall in this part into its ids;
    `previous(sources)` gives the previous step's tokens at those indices (it may wait for them)."""
    ids = batch.arrays[RAD_STEP_IDS]
    targets, sources = np.asarray(feed.targets, np.int64), np.asarray(feed.sources, np.int64)
    inside = (targets >= batch.start) & (targets < batch.start + len(ids))
    if inside.any():
        ids[targets[inside] - batch.start] = previous(sources[inside])


def gather_tokens(batches: list[MicroBatch], sampled: list[np.ndarray], seqs: int) -> np.ndarray:
    """The step's token of each of its `seqs` sequences, from each part's sampled tokens."""
    tokens = np.zeros(seqs, np.int32)
    for batch, got in zip(batches, sampled, strict=True):
        tokens[batch.sequences[batch.kept]] = got[batch.kept]
    return tokens
