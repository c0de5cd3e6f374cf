"""How far libr4d's rows are from libref's: the figures behind docs/LIBR4D.md's tolerances.

    python bench/libr4d_errors.py [--model smol.rad] [--tokens 32] [--seeds 3]

Part 1, the rows: SmolLM2-135M's geometries with random data (linear weights quantised to Q4_1,
the 49152x576 Q8_0 lm head; activations unit normal with a few 8x outlier channels, as a normed
residual stream has), every gemm path (decode GEMV with int16 / int8 / f32 activations, prefill
GEMM), attention over a paged cache, and the rows that are meant to be bit-exact. The error is
max|y - ref| / max|ref| over the output, the worst over --seeds draws.

Part 2, the model (--model, a converted SmolLM2 .rad): greedy tokens of a few prompts through the
engine with libr4d at each activation path and with libref (--kernels libref
--debug-accept-reference-kernels); where they part, the position and the two logits' margin.
"""

import argparse
import os
import sys

import numpy as np

from radiance.abi import RAD_DT_ENCODED, RAD_DT_NONE, RAD_OK, RadArgs, RadTensor, rad_tensor
from radiance.engine.loading.registry import Registry
from radiance.weights import formats
from radiance.weights.planes import plane_raw

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 576, 9, 3, 64, 1536, 49152
LINEAR = [("q", 576, 576), ("k", 192, 576), ("v", 192, 576), ("o", 576, 576), ("gate", FFN, HIDDEN),
          ("up", FFN, HIDDEN), ("down", HIDDEN, FFN)]
PROMPTS = ["The capital of France is", "Here is a short poem about the sea:\n", "def fibonacci(n):",
           "The three primary colours are", "Water boils at a temperature of"]


def weight(encoding, typed, shape):
    tensors = [rad_tensor(plane_raw(p, typed[p.name], shape)) for p in encoding.planes]
    from radiance.abi import RadWeightPlanes
    return RadWeightPlanes(encoding=encoding, rows=shape[0], cols=shape[1], planes=tensors)


def quantised(fmt, rows, cols, rng):
    w = (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32).reshape(rows, cols // 32, 32)
    if fmt == "q8_0":
        scale = (np.abs(w).max(axis=2) / 127).astype(np.float16)
        codes = np.clip(np.rint(w / scale[..., None].astype(np.float32)), -127, 127).astype(np.int8)
        return weight(formats.q8_0(), {"codes": codes.reshape(rows, cols), "scale": scale}, (rows, cols))
    low = w.min(axis=2).astype(np.float16)
    scale = ((w.max(axis=2) - low.astype(np.float32)) / 15).astype(np.float16)
    codes = np.clip(np.rint((w - low[..., None].astype(np.float32)) / scale[..., None].astype(np.float32)), 0, 15)
    return weight(formats.q4_1(), {"codes": codes.reshape(rows, cols).astype(np.uint8), "scale": scale, "min": -low},
                  (rows, cols))


def activations(m, k, rng):
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, rng.choice(k, 4, replace=False)] *= 8
    return x


def launch(row, operands, params, weights=None):
    tensors = []
    for i, operand in enumerate(operands):
        if weights and i in weights:
            w = weights[i]
            code = row.info.layout(f"w{i}", w.encoding, dict(params)) if row.info.layout else None
            tensors.append(RadTensor(data=row.info.relayout(w, dict(params)), dtype=RAD_DT_NONE) if code == RAD_OK
                           else RadTensor(data=w, dtype=RAD_DT_ENCODED))
        else:
            tensors.append(rad_tensor(operand))
    scratch = np.zeros(int(row.info.scratch(dict(params))), np.uint8) if row.info.scratch else None
    status = row.info.launch(RadArgs(t=tuple(tensors), params=dict(params), scratch=scratch))
    assert status == 0, (row.name, status)


def row(registry, op, library, name=None):
    return next(r for r in registry.rows_for(op) if r.plugin.name == library and (name is None or r.name == name))


def rel_err(y, ref):
    return float(np.abs(y.astype(np.float64) - ref).max() / np.abs(ref).max())


def rows_part(registry, seeds):
    ref_gemm = row(registry, "gemm", "libref")
    print("gemm: max|y - ref| / max|ref|, worst of", seeds, "draws")
    print(f"{'weight':24s} {'GEMV aq=16':>11s} {'GEMV aq=8':>10s} {'GEMV aq=0':>10s} {'GEMM M=37':>10s}")
    for name, n, k in LINEAR + [("lm head (q8_0)", VOCAB, HIDDEN)]:
        fmt = "q8_0" if "lm head" in name else "q4_1"
        worst = {}
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            w = quantised(fmt, n, k, rng)
            for label, m, aq in (("16", 1, 16), ("8", 1, 8), ("0", 1, 0), ("gemm", 37, None)):
                if m == 37 and n == VOCAB and seed:
                    continue  # libref's 37-row lm head takes seconds: one draw
                x = activations(m, k, rng)
                params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
                if aq is not None:
                    params["aq"] = aq
                ours = row(registry, "gemm", "libr4d", f"r4d_{'gemv' if m == 1 else 'gemm'}_{fmt}")
                y, ref = np.zeros((m, n), np.float32), np.zeros((m, n), np.float32)
                launch(ours, [x, None, y], params, {1: w})
                launch(ref_gemm, [x, None, ref], params, {1: w})
                worst[label] = max(worst.get(label, 0.0), rel_err(y, ref))
        print(f"{name + f' {n}x{k}':24s} {worst['16']:11.1e} {worst['8']:10.1e} {worst['0']:10.1e} {worst['gemm']:10.1e}")

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    from test_libr4d_attention import paged_step, run_attention
    worst = 0.0
    for seed in range(seeds):
        for seqs in ([(0, 20), (40, 1), (33, 7), (0, 1)], [(1000, 1), (700, 3)], [(100, 37)]):
            step = paged_step(seqs, num_blocks=160, seed=seed)
            ours, ref = run_attention(registry, "libr4d", step)[0], run_attention(registry, "libref", step)[0]
            worst = max(worst, rel_err(ours[:step["m"]], ref[:step["m"]]))
    print(f"\nattention (paged, block 16, prefill + decode, contexts to 1001): {worst:.1e}")
    print("embedding, rmsnorm, add, silu_mul, take_rows, rope: bit-exact (tests/test_libr4d_*.py assert it); "
          "sample: libref's tokens")


def greedy(model, kernels, accept, tokens, aq=None):
    if aq is not None:
        os.environ["RADIANCE_R4D_AQ"] = str(aq)
    from radiance.config import Config
    from radiance.generation.sequence import SamplingParams
    from radiance.launch import engine_over, open_ranks

    out = []
    with open_ranks(Config(model=str(model), kernels=kernels, accept_reference=accept)) as ranks:
        engine = engine_over(ranks)
        for prompt in PROMPTS:
            sequence = engine.add(engine.text.encode(prompt), SamplingParams(max_tokens=tokens, temperature=0.0))
            while not sequence.finished:
                engine.step()
            out.append(list(sequence.output_ids))
    os.environ.pop("RADIANCE_R4D_AQ", None)
    return out


def model_part(model, tokens):
    print(f"\nwhole model ({model}): greedy tokens vs libref, {len(PROMPTS)} prompts, {tokens} tokens each")
    reference = greedy(model, "libref", True, tokens)
    for aq in (16, 8, 0):
        ours = greedy(model, "libr4d", False, tokens, aq)
        parts = []
        for a, b in zip(ours, reference):
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            parts.append("same" if first is None and len(a) == len(b) else f"part at {first}")
        print(f"  libr4d aq={aq:2d}: " + ", ".join(parts))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a converted SmolLM2 .rad: also compare greedy tokens")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--seeds", type=int, default=3)
    options = parser.parse_args()
    registry = Registry(radiance_home="")
    rows_part(registry, options.seeds)
    registry.close()
    if options.model:
        model_part(options.model, options.tokens)


if __name__ == "__main__":
    main()
