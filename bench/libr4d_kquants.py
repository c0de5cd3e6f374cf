"""libr4d's rows for the GGUF block types (q4_0, q5_0, q5_1, q2_k..q6_k) against its q4_1 and q8_0
rows, measured in the same run on the same shape: µs per launch (the best of --repeats passes over the
weights: on a shared machine the best pass is the one least disturbed) and the GGUF bytes read per
second, at M = 1 (the decode GEMV band) and M = --prefill (the GEMM band). "M=1 aq=0" is the same GEMV
row with f32 activations (each weight row decoded to f32 first: what the k-quant rows did before
their integer path), so the integer path's gain is read off the same run; likewise "M=P aq=0" is the
GEMM band on its f32 panels, against its default (aq=16: AMX int8 tiles where the build and kernel
have them, for the formats of one scale per 32 and q6_k; the panels otherwise).

    python bench/libr4d_kquants.py [--threads 2] [--rows 640] [--cols 2048] [--prefill 64] [--repeats 30]

Default shape: Gemma 3 270M's ffn_down (640 x 2048), which its Q4_K_M file holds at Q4_K / Q6_K.
Weights are random GGUF blocks imported as the converter imports them; --weights distinct copies
are cycled so the timing streams from memory rather than from one cached weight.
"""

import argparse
import time

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from radiance.abi import RAD_DT_ENCODED, RadArgs, RadTensor, RadWeightPlanes, rad_tensor
from radiance.engine.loading.registry import Registry
from radiance.weights.gguf_blocks import gguf_encoding, split_blocks

TYPES = (Q.Q4_1, Q.Q8_0, Q.Q4_0, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K)
F16_FIELDS = {Q.Q4_1: (0, 2), Q.Q8_0: (0,), Q.Q4_0: (0,), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q2_K: (80, 82),
              Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def weight(qtype, rows, cols, rng):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, cols // block_size, type_size), np.uint8)
    for offset in F16_FIELDS[qtype]:
        data[..., offset:offset + 2] = rng.uniform(-0.02, 0.02, (rows, cols // block_size, 1)).astype(
            np.float16).view(np.uint8)
    raw = split_blocks(data.reshape(rows, -1), qtype, (rows, cols))
    encoding = gguf_encoding(qtype)
    return RadWeightPlanes(encoding=encoding, rows=rows, cols=cols,
                           planes=[rad_tensor(raw[p.name]) for p in encoding.planes]), data.nbytes


def row_for(registry, geometry):
    from radiance.engine.selection.bands import resolve
    rows = [row for row in registry.rows_for("gemm") if row.plugin.name == "libr4d"]
    return resolve("gemm", registry.ops["gemm"].schema, rows, geometry, {}, 1, 256).band_for(geometry["M"]).row


def time_row(row, weights, m, k, n, geometry, repeats):
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    y = np.zeros((m, n), np.float32)
    scratch = np.zeros(int(row.info.scratch(dict(geometry))), np.uint8) if row.info.scratch else None
    calls = []
    for w in weights:
        t = (rad_tensor(x), RadTensor(data=w, dtype=RAD_DT_ENCODED, ndim=2, shape=(n, k, 0, 0)), rad_tensor(y))
        args = RadArgs(t=t, params=dict(geometry), scratch=scratch, scratch_bytes=0 if scratch is None else scratch.size)
        calls.append(args)
    for args in calls[:2]:
        assert row.info.launch(args) == 0, row.name
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for args in calls:
            row.info.launch(args)
        samples.append((time.perf_counter() - start) / len(calls))
    return min(samples)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=640)
    parser.add_argument("--cols", type=int, default=2048, help="K: a multiple of 256")
    parser.add_argument("--prefill", type=int, default=64)
    parser.add_argument("--weights", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    registry = Registry(radiance_home="", kernels="libr4d")
    libr4d = next(lib for lib in registry.hierarchy if lib.name == "libr4d").module
    libr4d.set_threads(args.threads)
    print(f"libr4d: {libr4d.backend()}; weight {args.rows} x {args.cols}, {args.weights} copies cycled")
    prefill = f"M={args.prefill}"
    print(f"{'format':7} {'row (M=1)':18} {'M=1 µs':>8} {'GB/s':>6} {'M=1 aq=0':>10} {prefill + ' µs':>9} "
          f"{prefill + ' aq=0':>11} {'aq=0 / aq=16':>12} {'vs q4_1 (M=1, ' + prefill + ')':>24}")
    rng = np.random.default_rng(0)
    peer = {}
    try:
        for qtype in TYPES:
            made = [weight(qtype, args.rows, args.cols, rng) for _ in range(args.weights)]
            weights, nbytes = [w for w, _ in made], made[0][1]
            found = {}
            for m, extra in ((1, {}), (args.prefill, {}), ("f32", {"aq": 0}), ("panels", {"aq": 0})):
                rows = 1 if m == "f32" else args.prefill if m == "panels" else m
                geometry = {"M": rows, "N": args.rows, "K": args.cols, "wdtype": qtype.name.lower(), "dtype": "f32",
                            "split_k": 1, **extra}
                row = row_for(registry, geometry)
                found[m] = (row.name, time_row(row, weights, rows, args.cols, args.rows, geometry, args.repeats))
            if qtype == Q.Q4_1:
                peer = {m: seconds for m, (_, seconds) in found.items()}
            (name, one), (_, many), (_, f32), (_, panels) = found[1], found[args.prefill], found["f32"], found["panels"]
            print(f"{qtype.name:7} {name:18} {one * 1e6:8.1f} {nbytes / one / 1e9:6.1f} {f32 * 1e6:10.1f} "
                  f"{many * 1e6:9.1f} {panels * 1e6:11.1f} {panels / many:11.2f}x "
                  f"{one / peer[1]:11.2f}x {many / peer[args.prefill]:6.2f}x")
    finally:
        registry.close()


if __name__ == "__main__":
    main()
