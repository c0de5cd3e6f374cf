"""The step inputs of rad_arch.h: the buffers the engine fills (or reads) every step, each with its
element type and shape as the header's comments give them (tests/test_abi_mirror.py holds the two
to each other). The one statement of them in Python: a scheduler writes a step's plan from it
(generation/step_plan.py) and an executor allocates and narrows its buffers from it
(engine/running/step_inputs.py)."""

from dataclasses import dataclass

import numpy as np

from .constants import (
    RAD_STEP_BLOCK_TABLES, RAD_STEP_CONTEXT_LENS, RAD_STEP_CU_SEQLENS, RAD_STEP_IDS, RAD_STEP_LAST_INDEX,
    RAD_STEP_POSITIONS, RAD_STEP_RNG, RAD_STEP_SLOTS, RAD_STEP_TEMPERATURE, RAD_STEP_TOKENS, RAD_STEP_TOP_K,
    RAD_STEP_TOP_P,
)


@dataclass(frozen=True)
class StepInput:
    dtype: type  # np.int32, np.float32 or np.uint64
    rows: str  # what its first extent is: "tokens", "seqs" or "seqs + 1"
    cols: int | str | None = None  # a second extent: a number, "max blocks" (a block table's width), or none

    def shape(self, tokens: int, seqs: int, max_blocks: int) -> tuple[int, ...]:
        rows = {"tokens": tokens, "seqs": seqs, "seqs + 1": seqs + 1}[self.rows]
        if self.cols is None:
            return (rows,)
        return (rows, max_blocks if self.cols == "max blocks" else self.cols)


STEP_INPUTS = {
    RAD_STEP_IDS: StepInput(np.int32, "tokens"),
    RAD_STEP_POSITIONS: StepInput(np.int32, "tokens"),
    RAD_STEP_SLOTS: StepInput(np.int32, "tokens"),
    RAD_STEP_CU_SEQLENS: StepInput(np.int32, "seqs + 1"),
    RAD_STEP_CONTEXT_LENS: StepInput(np.int32, "seqs"),
    RAD_STEP_BLOCK_TABLES: StepInput(np.int32, "seqs", "max blocks"),
    RAD_STEP_LAST_INDEX: StepInput(np.int32, "seqs"),
    RAD_STEP_TEMPERATURE: StepInput(np.float32, "seqs"),
    RAD_STEP_TOP_K: StepInput(np.int32, "seqs"),
    RAD_STEP_TOP_P: StepInput(np.float32, "seqs"),
    RAD_STEP_RNG: StepInput(np.uint64, "seqs", 2),
    RAD_STEP_TOKENS: StepInput(np.int32, "seqs"),  # the sampled ones: the step writes them, no plan does
}
PLANNED = tuple(name for name in STEP_INPUTS if name != RAD_STEP_TOKENS)  # what a step's plan carries
