"""The q8_0 prefill GEMM's two paths on SmolLM2-135M's shapes, in the same run: r4d.c's f32 panels
(aq=0) against its int16 activations and integer products (aq=16: AMX int8 tiles where built and
granted, else AVX2 builds' register tiles), µs per launch, the
best of --repeats alternated launches, a fresh x every launch (its activations quantised each time,
as the first GEMM of a set of rows pays in a step).

    python bench/libr4d_q8_0_gemm.py [--threads 2] [--m 128] [--repeats 40]

On an AVX-512 build without AMX, or a portable one, both paths are the f32 panels (docs/LIBR4D.md).
"""

import argparse
import ctypes

import numpy as np

SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536))  # q/o, k/v, gate/up, down: (N, K)
Q8_0 = 3  # r4d.c's format code


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--m", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    import sys
    import time
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the in-tree plugins, by file
    from plugins.kernels.libr4d import native

    loaded = native.load()
    loaded.set_threads(args.threads)
    print(f"libr4d: {loaded.describe()}; M = {args.m}")
    rng = np.random.default_rng(0)
    for n, k in SHAPES:
        codes = rng.integers(-127, 128, (n, k), dtype=np.int8)
        scale = rng.uniform(0.001, 0.01, (n, k // 32)).astype(np.float16)
        xs = [rng.standard_normal((args.m, k)).astype(np.float32) for _ in range(2)]
        y = np.zeros((args.m, n), np.float32)
        y_head, x_heads = loaded.Header(), [loaded.Header() for _ in xs]
        y_head.fill(y)
        for head, x in zip(x_heads, xs):
            head.fill(x)
        best = {0: float("inf"), 16: float("inf")}
        for r in range(args.repeats):
            for aq in best:
                start = time.perf_counter()
                status = loaded.lib.r4d_gemm(ctypes.byref(x_heads[r % 2]), Q8_0, codes.ctypes.data, scale.ctypes.data,
                                             None, ctypes.byref(y_head), args.m, n, k, aq)
                best[aq] = min(best[aq], time.perf_counter() - start)
                assert status == 0, status
        print(f"{n:5d} x {k:<5d} f32 panels {best[0] * 1e6:8.0f} µs   int16 {best[16] * 1e6:8.0f} µs   "
              f"{best[0] / best[16]:.2f}x")


if __name__ == "__main__":
    main()
