"""The step inputs of a speculative decoder's own steps: each sequence's tokens given explicitly
(the drafts are no sequence's tokens yet), and the rows whose logits are taken, one a sequence (a
draft step: its last token) or every token (the target's verify step: the last known token and
each draft).

A step's sampled rows are its `seqs` extent (step.last_index, the sampling inputs, the logits).
Where a step samples every token, that extent outgrows the sequences, and the sequence inputs
(step.cu_seqlens, step.context_lens, step.block_tables) carry the real sequences first and then
empty ones, no token and no context: an op taking cu_seqlens counts the sequences from its length
and an empty one has nothing to attend (docs/OPS.md, attention)."""

from dataclasses import dataclass

import numpy as np

from radiance.abi import (
    PLANNED, RAD_STEP_BLOCK_TABLES, RAD_STEP_CONTEXT_LENS, RAD_STEP_CU_SEQLENS, RAD_STEP_IDS, RAD_STEP_LAST_INDEX,
    RAD_STEP_POSITIONS, RAD_STEP_RNG, RAD_STEP_SLOTS, RAD_STEP_TEMPERATURE, RAD_STEP_TOP_K, RAD_STEP_TOP_P, STEP_INPUTS,
)

from .kv_blocks import BlockManager
from .sequence import Sequence


@dataclass
class Entry:
    sequence: Sequence
    start: int  # the position of ids[0]
    ids: list[int]


def speculative_arrays(entries: list[Entry], blocks: BlockManager, max_blocks: int, every: bool) -> dict:
    """The plan arrays of one step over `entries`; sampled rows: each entry's last token, or with
    `every` each token (in order: entry by entry, token by token)."""
    tokens = sum(len(entry.ids) for entry in entries)
    seqs = tokens if every else len(entries)
    arrays = {name: np.zeros(STEP_INPUTS[name].shape(tokens, seqs, max_blocks), STEP_INPUTS[name].dtype)
              for name in PLANNED}
    offset, row = 0, 0
    for s, entry in enumerate(entries):
        sequence, count = entry.sequence, len(entry.ids)
        stop = offset + count
        positions = np.arange(entry.start, entry.start + count)
        table = np.asarray(sequence.blocks, np.int32)
        arrays[RAD_STEP_IDS][offset:stop] = entry.ids
        arrays[RAD_STEP_POSITIONS][offset:stop] = positions
        arrays[RAD_STEP_SLOTS][offset:stop] = table[positions // blocks.block_size] * blocks.block_size + \
            positions % blocks.block_size
        arrays[RAD_STEP_CU_SEQLENS][s] = offset
        arrays[RAD_STEP_CONTEXT_LENS][s] = entry.start + count
        arrays[RAD_STEP_BLOCK_TABLES][s, :len(table)] = table
        rows = range(offset, stop) if every else (stop - 1,)
        for index in rows:
            params = sequence.params
            arrays[RAD_STEP_LAST_INDEX][row] = index
            arrays[RAD_STEP_TEMPERATURE][row] = params.temperature
            arrays[RAD_STEP_TOP_K][row] = params.top_k
            arrays[RAD_STEP_TOP_P][row] = params.top_p
            arrays[RAD_STEP_RNG][row] = (params.seed, sequence.num_outputs)
            row += 1
        offset = stop
    arrays[RAD_STEP_CU_SEQLENS][len(entries):] = offset  # the empty sequences after the real ones
    return arrays
