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
    the step in flight, for the sequences whose last token that step samples (pending here).

    Python lists a field, each written into its array once: a decode step plans one token for each of
    up to max_seqs sequences, and numpy's per-call cost on tiny arrays was most of the planning
    (~1 ms at 64 sequences on one core, all of it ahead of the step when the ranks do not run ahead)."""
    seqs, tokens = len(plan.chunks), plan.tokens
    arrays = {name: np.zeros(STEP_INPUTS[name].shape(tokens, seqs, max_blocks), STEP_INPUTS[name].dtype)
              for name in PLANNED}
    size = blocks.block_size
    ids, positions, slots, fed = [], [], [], []
    cu_seqlens, context_lens, last_index, rng = [], [], [], []
    tables = arrays[RAD_STEP_BLOCK_TABLES]
    offset = 0
    for s, chunk in enumerate(plan.chunks):
        sequence, stop = chunk.sequence, offset + chunk.count
        known = sequence.known_ids(chunk.start, chunk.start + chunk.count)
        ids += known
        if len(known) < chunk.count:  # the last position is the token the step in flight samples
            if chunk.count - len(known) != 1 or previous is None or sequence not in previous:
                raise RuntimeError(f"sequence {sequence.id}: {chunk.count - len(known)} ids planned that no step "
                                   f"in flight samples")
            ids.append(PLACEHOLDER)
            fed.append((stop - 1, previous[sequence]))
        table = sequence.blocks
        span = range(chunk.start, chunk.start + chunk.count)
        positions += span
        slots += [table[position // size] * size + position % size for position in span]
        cu_seqlens.append(offset)
        context_lens.append(chunk.start + chunk.count)
        last_index.append(stop - 1)
        tables[s, :len(table)] = table
        rng.append((sequence.params.seed, sequence.num_outputs))  # the pending ones counted: they come first
        offset = stop
    cu_seqlens.append(offset)
    arrays[RAD_STEP_IDS][:] = ids
    arrays[RAD_STEP_POSITIONS][:] = positions
    arrays[RAD_STEP_SLOTS][:] = slots
    arrays[RAD_STEP_CU_SEQLENS][:] = cu_seqlens
    arrays[RAD_STEP_CONTEXT_LENS][:] = context_lens
    arrays[RAD_STEP_LAST_INDEX][:] = last_index
    arrays[RAD_STEP_TEMPERATURE][:] = [chunk.sequence.params.temperature for chunk in plan.chunks]
    arrays[RAD_STEP_TOP_K][:] = [chunk.sequence.params.top_k for chunk in plan.chunks]
    arrays[RAD_STEP_TOP_P][:] = [chunk.sequence.params.top_p for chunk in plan.chunks]
    arrays[RAD_STEP_RNG][:] = rng
    return arrays, Feed.of(fed)
