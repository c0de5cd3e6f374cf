"""One weight to write: its encoding and how its planes are produced, row block by row block."""

from dataclasses import dataclass
from typing import Callable

from radiance.abi import RadEncoding


@dataclass
class WeightJob:
    name: str
    shape: tuple          # as stored: (rows, cols), or (n,) for a vector
    encoding: RadEncoding
    row_block: int        # rows per produce() call; 0 = the whole weight
    method: str           # how the planes are made, for the error report ("q4_1 group=32", "gguf Q8_0")
    # rows [r0, r1) -> ({plane: raw bytes np.uint8 [plane rows, row bytes]}, f32 source rows [r1 - r0, cols])
    produce: Callable

    @property
    def matrix(self) -> tuple[int, int]:
        """The [rows, cols] that encodings see: a vector is one row."""
        return tuple(self.shape) if len(self.shape) == 2 else (1, self.shape[0])
