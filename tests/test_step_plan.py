"""plan_arrays: a step's arrays written from Python lists a field at once, against what each
chunk means taken one at a time (a prefill chunk that crosses from the prompt into the outputs,
decodes, a block boundary), and Sequence.known_ids against slicing token_ids."""

import numpy as np

from radiance.abi import (
    RAD_STEP_BLOCK_TABLES, RAD_STEP_CONTEXT_LENS, RAD_STEP_CU_SEQLENS, RAD_STEP_IDS, RAD_STEP_LAST_INDEX,
    RAD_STEP_POSITIONS, RAD_STEP_RNG, RAD_STEP_SLOTS, RAD_STEP_TEMPERATURE, RAD_STEP_TOP_K, RAD_STEP_TOP_P,
)
from radiance.generation.kv_blocks import BlockManager
from radiance.generation.scheduler import Chunk, StepPlan
from radiance.generation.sequence import SamplingParams, Sequence
from radiance.generation.step_plan import plan_arrays


def test_known_ids_is_a_slice_of_token_ids():
    sequence = Sequence(0, [5, 6, 7, 8], SamplingParams(seed=1))
    sequence.output_ids = [9, 10, 11]
    for start in range(8):
        for stop in range(start, 8):
            assert sequence.known_ids(start, stop) == sequence.token_ids[start:stop], (start, stop)


def test_each_field_holds_what_its_chunk_says():
    blocks = BlockManager(64, 4)
    prefill = Sequence(0, list(range(100, 110)), SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=11))
    prefill.output_ids = [200, 201]
    decode = Sequence(1, list(range(300, 306)), SamplingParams(temperature=0, seed=12))
    decode.output_ids = [400, 401, 402]
    blocks.allocate(decode, 9)   # decode's blocks first, so neither sequence's blocks are 0, 1, 2, ...
    blocks.allocate(prefill, 12)
    chunks = [Chunk(prefill, 7, 5), Chunk(decode, 8, 1)]  # positions 7..11 cross from prompt into outputs
    arrays, feed = plan_arrays(StepPlan(chunks), blocks, 4)
    assert feed is None or not feed
    assert arrays[RAD_STEP_IDS].tolist() == [107, 108, 109, 200, 201, 402]
    assert arrays[RAD_STEP_POSITIONS].tolist() == [7, 8, 9, 10, 11, 8]
    expected_slots = [prefill.blocks[p // 4] * 4 + p % 4 for p in range(7, 12)] + [decode.blocks[2] * 4]
    assert arrays[RAD_STEP_SLOTS].tolist() == expected_slots
    assert arrays[RAD_STEP_CU_SEQLENS].tolist() == [0, 5, 6]
    assert arrays[RAD_STEP_CONTEXT_LENS].tolist() == [12, 9]
    assert arrays[RAD_STEP_LAST_INDEX].tolist() == [4, 5]
    tables = arrays[RAD_STEP_BLOCK_TABLES]
    assert tables[0, :3].tolist() == prefill.blocks and tables[1, :3].tolist() == decode.blocks
    assert not tables[:, 3:].any()
    assert np.allclose(arrays[RAD_STEP_TEMPERATURE], [0.5, 0.0])
    assert arrays[RAD_STEP_TOP_K].tolist() == [3, 0]
    assert np.allclose(arrays[RAD_STEP_TOP_P], [0.9, 1.0])
    assert arrays[RAD_STEP_RNG].tolist() == [[11, 2], [12, 3]]
