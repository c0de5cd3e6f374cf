"""A scheduled step written as the arrays every rank's step inputs take (and a coordinator can
send): ids, positions, slots, the sequence boundaries, block tables and sampling parameters."""

import numpy as np

from radiance.abi import (
    RAD_STEP_BLOCK_TABLES, RAD_STEP_CONTEXT_LENS, RAD_STEP_CU_SEQLENS, RAD_STEP_IDS, RAD_STEP_LAST_INDEX,
    RAD_STEP_POSITIONS, RAD_STEP_RNG, RAD_STEP_SLOTS, RAD_STEP_TEMPERATURE, RAD_STEP_TOP_K, RAD_STEP_TOP_P,
)

from .kv_blocks import BlockManager
from .scheduler import StepPlan


def plan_arrays(plan: StepPlan, blocks: BlockManager, max_blocks: int) -> dict:
    seqs, tokens = len(plan.chunks), plan.tokens
    arrays = {
        RAD_STEP_IDS: np.empty(tokens, np.int32), RAD_STEP_POSITIONS: np.empty(tokens, np.int32),
        RAD_STEP_SLOTS: np.empty(tokens, np.int32), RAD_STEP_CU_SEQLENS: np.empty(seqs + 1, np.int32),
        RAD_STEP_CONTEXT_LENS: np.empty(seqs, np.int32), RAD_STEP_LAST_INDEX: np.empty(seqs, np.int32),
        RAD_STEP_BLOCK_TABLES: np.zeros((seqs, max_blocks), np.int32),
        RAD_STEP_TEMPERATURE: np.empty(seqs, np.float32), RAD_STEP_TOP_K: np.empty(seqs, np.int32),
        RAD_STEP_TOP_P: np.empty(seqs, np.float32), RAD_STEP_RNG: np.empty((seqs, 2), np.uint64),
    }
    offset = 0
    for s, chunk in enumerate(plan.chunks):
        sequence, stop = chunk.sequence, offset + chunk.count
        positions = np.arange(chunk.start, chunk.start + chunk.count)
        table = np.asarray(sequence.blocks, np.int32)
        arrays[RAD_STEP_IDS][offset:stop] = sequence.token_ids[chunk.start:chunk.start + chunk.count]
        arrays[RAD_STEP_POSITIONS][offset:stop] = positions
        arrays[RAD_STEP_SLOTS][offset:stop] = table[positions // blocks.block_size] * blocks.block_size + \
            positions % blocks.block_size
        arrays[RAD_STEP_CU_SEQLENS][s] = offset
        arrays[RAD_STEP_CONTEXT_LENS][s] = chunk.start + chunk.count
        arrays[RAD_STEP_LAST_INDEX][s] = stop - 1
        arrays[RAD_STEP_BLOCK_TABLES][s, :len(table)] = table
        params = sequence.params
        arrays[RAD_STEP_TEMPERATURE][s] = params.temperature
        arrays[RAD_STEP_TOP_K][s] = params.top_k
        arrays[RAD_STEP_TOP_P][s] = params.top_p
        arrays[RAD_STEP_RNG][s] = (params.seed, len(sequence.output_ids))
        offset = stop
    arrays[RAD_STEP_CU_SEQLENS][seqs] = offset
    return arrays
