"""A scheduled step written as the arrays every rank's step inputs take (and a coordinator can
send): ids, positions, slots, the sequence boundaries, block tables and sampling parameters; and,
when it is planned while the step before it runs, the feed of the ids that step samples (feed.py)."""

import numpy as np

from radiance.abi import (
    PLANNED, RAD_STEP_BLOCK_TABLES, RAD_STEP_CONTEXT_LENS, RAD_STEP_CU_SEQLENS, RAD_STEP_IDS, RAD_STEP_LAST_INDEX,
    RAD_STEP_POSITIONS, RAD_STEP_RNG, RAD_STEP_SLOTS, RAD_STEP_TEMPERATURE, RAD_STEP_TOP_K, RAD_STEP_TOP_P, STEP_INPUTS,
)

from .feed import PLACEHOLDER, Feed
from .kv_blocks import BlockManager
from .scheduler import StepPlan


def plan_arrays(plan: StepPlan, blocks: BlockManager, max_blocks: int, previous: dict | None = None) -> tuple[dict, Feed | None]:
    """(the arrays, the feed). `previous`: sequence -> the index of its token among the tokens of
    the step in flight, for the sequences whose last token that step samples (pending here)."""
    seqs, tokens = len(plan.chunks), plan.tokens
    arrays = {name: np.zeros(STEP_INPUTS[name].shape(tokens, seqs, max_blocks), STEP_INPUTS[name].dtype)
              for name in PLANNED}
    offset, fed = 0, []
    for s, chunk in enumerate(plan.chunks):
        sequence, stop = chunk.sequence, offset + chunk.count
        positions = np.arange(chunk.start, chunk.start + chunk.count)
        table = np.asarray(sequence.blocks, np.int32)
        known = sequence.token_ids[chunk.start:chunk.start + chunk.count]
        arrays[RAD_STEP_IDS][offset:offset + len(known)] = known
        if len(known) < chunk.count:  # the last position is the token the step in flight samples
            if chunk.count - len(known) != 1 or previous is None or sequence not in previous:
                raise RuntimeError(f"sequence {sequence.id}: {chunk.count - len(known)} ids planned that no step "
                                   f"in flight samples")
            arrays[RAD_STEP_IDS][stop - 1] = PLACEHOLDER
            fed.append((stop - 1, previous[sequence]))
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
        arrays[RAD_STEP_RNG][s] = (params.seed, sequence.num_outputs)  # the pending ones counted: they come first
        offset = stop
    arrays[RAD_STEP_CU_SEQLENS][seqs] = offset
    return arrays, Feed.of(fed)
