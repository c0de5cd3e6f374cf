"""The step buffers: what the scheduler writes before every step and the sampled tokens it reads
after (radiance.abi's STEP_INPUTS: each one's type and shape). Allocated once at their largest;
each step narrows views of them."""

import numpy as np

from radiance.abi import STEP_INPUTS


class StepInputs:
    def __init__(self, max_tokens: int, max_seqs: int, max_blocks: int):
        self.arrays = {name: np.zeros(spec.shape(max_tokens, max_seqs, max_blocks), spec.dtype)
                       for name, spec in STEP_INPUTS.items()}

    def view(self, name: str, tokens: int, seqs: int) -> np.ndarray:
        """The rows of one step: as many as its tokens or sequences (and one more, cu_seqlens)."""
        rows = STEP_INPUTS[name].shape(tokens, seqs, 0)[0]
        return self.arrays[name][:rows]

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]
