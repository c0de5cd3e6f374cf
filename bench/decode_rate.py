"""Decode rate of the core decoder on a 50M-element Q4_1 weight, with gguf's own dequantiser on the
same blocks in the same run as the peer.

    python bench/decode_rate.py [--rows 12500] [--cols 4000] [--repeats 3]

Prints elements/s and GB/s of plane bytes read for each, the best of `repeats` runs, and the ratio.
"""

import argparse
import time

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize

from radiance.weights.decode import decode
from radiance.weights.gguf_blocks import gguf_encoding, split_blocks


def q4_1_blocks(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Raw Q4_1 bytes [rows, cols / 32 * 20]: random nibbles, finite f16 d and m."""
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[Q.Q4_1]
    data = rng.integers(0, 256, (rows, cols // block_size, type_size), np.uint8)
    data[..., 0:4] = rng.uniform(-1, 1, (rows, cols // block_size, 2)).astype(np.float16).view(np.uint8)
    return data.reshape(rows, -1)


def best_time(function, repeats: int) -> tuple[float, np.ndarray]:
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=12500)
    parser.add_argument("--cols", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shape = (args.rows, args.cols)
    elements = args.rows * args.cols
    data = q4_1_blocks(*shape)
    encoding = gguf_encoding(Q.Q4_1)
    split_seconds, planes = best_time(lambda: split_blocks(data, Q.Q4_1, shape), 1)
    plane_bytes = sum(raw.nbytes for raw in planes.values())
    ours, decoded = best_time(lambda: decode(encoding, planes, shape), args.repeats)
    peer, expected = best_time(lambda: dequantize(data, Q.Q4_1), args.repeats)
    if not np.array_equal(decoded, expected.reshape(shape)):
        raise SystemExit("decode_rate: the core decoder and gguf disagree on the same blocks")
    print(f"Q4_1 {args.rows}x{args.cols} = {elements / 1e6:.1f}M elements, "
          f"{plane_bytes / 1e6:.1f} MB of planes (split from GGUF blocks in {split_seconds:.3f} s)")
    for label, seconds in (("core decoder", ours), ("gguf.quants.dequantize", peer)):
        print(f"  {label:24s} {seconds:7.3f} s  {elements / seconds / 1e6:8.1f} M elements/s  "
              f"{plane_bytes / seconds / 1e9:6.2f} GB/s of planes")
    print(f"  ratio core/gguf rate: {peer / ours:.2f}x")


if __name__ == "__main__":
    main()
