"""The step buffers: what the scheduler writes before every step and the sampled tokens it reads
after. Allocated once at their largest; each step narrows views of them."""

import numpy as np

from radiance.abi import (
    RAD_STEP_BLOCK_TABLES, RAD_STEP_CONTEXT_LENS, RAD_STEP_CU_SEQLENS, RAD_STEP_IDS, RAD_STEP_LAST_INDEX,
    RAD_STEP_POSITIONS, RAD_STEP_RNG, RAD_STEP_SLOTS, RAD_STEP_TEMPERATURE, RAD_STEP_TOKENS, RAD_STEP_TOP_K,
    RAD_STEP_TOP_P,
)

PER_TOKEN = {RAD_STEP_IDS: np.int32, RAD_STEP_POSITIONS: np.int32, RAD_STEP_SLOTS: np.int32}
PER_SEQUENCE = {RAD_STEP_CONTEXT_LENS: np.int32, RAD_STEP_LAST_INDEX: np.int32, RAD_STEP_TEMPERATURE: np.float32,
                RAD_STEP_TOP_K: np.int32, RAD_STEP_TOP_P: np.float32, RAD_STEP_TOKENS: np.int32}


class StepInputs:
    def __init__(self, max_tokens: int, max_seqs: int, max_blocks: int):
        self.arrays = {name: np.zeros(max_tokens, dtype) for name, dtype in PER_TOKEN.items()}
        self.arrays.update({name: np.zeros(max_seqs, dtype) for name, dtype in PER_SEQUENCE.items()})
        self.arrays[RAD_STEP_CU_SEQLENS] = np.zeros(max_seqs + 1, np.int32)
        self.arrays[RAD_STEP_BLOCK_TABLES] = np.zeros((max_seqs, max_blocks), np.int32)
        self.arrays[RAD_STEP_RNG] = np.zeros((max_seqs, 2), np.uint64)

    def view(self, name: str, tokens: int, seqs: int) -> np.ndarray:
        array = self.arrays[name]
        if name in PER_TOKEN:
            return array[:tokens]
        if name == RAD_STEP_CU_SEQLENS:
            return array[:seqs + 1]
        return array[:seqs]

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]
