"""libr4d's decode attention over an f32 KV cache against the same over an f16 one (--kv-cache-dtype),
in the same run, at SmolLM2-135M's heads (9 query heads, 3 kv heads, head_dim 64).

    python bench/attention_kv_dtype.py [--contexts 128 512 2048] [--tokens 1] [--threads 2] [--rounds 5] [--passes 20]

A pass is one decode token's attention in 30 layers, each layer over a cache of its own, after 128 MB
of other data streamed through the processor's caches (a token's weights stream past between one
token's attention launches and the next's), so the cached rows come from memory as in a real decode.
`--tokens T` makes each step T new tokens of the sequence (the last T positions of the context: a
prefill chunk at T > 1), which reads each cached row once per token after it. The two cache types alternate
pass by pass; each round prints the median µs a layer of each and the ratio f32 / f16 (above 1: the
f16 cache is faster). The last line is the median of the rounds' ratios.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from libr4d_ops import Call, row_for  # noqa: E402

LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 30, 9, 3, 64, 16


def layer_calls(registry, context, tokens, cache, rng):
    """One step of `tokens` new tokens (positions context - tokens .. context - 1) of each layer, over
    caches of type `cache`."""
    blocks = -(-context // BLOCK)
    kv = KV_HEADS * HEAD_DIM
    table = rng.permutation(blocks).astype(np.int32)[None, :]  # blocks scattered, as the scheduler's
    position = np.arange(context - tokens, context, dtype=np.int32)
    slot = (table[0, position // BLOCK] * BLOCK + position % BLOCK).astype(np.int32)
    params = {"M": tokens, "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "block_size": BLOCK,
              "scale": HEAD_DIM ** -0.5, "dtype": "f32"}
    row = row_for(registry, "attention", "libr4d", **params)
    calls = []
    for _ in range(LAYERS):
        q, k, v = (rng.standard_normal((tokens, n)).astype(np.float32) for n in (HEADS * HEAD_DIM, kv, kv))
        k_cache, v_cache = (rng.standard_normal((blocks * BLOCK, kv)).astype(cache) for _ in range(2))
        out = np.zeros((tokens, HEADS * HEAD_DIM), np.float32)
        calls.append(Call(row, [q, k, v, k_cache, v_cache, slot, position, np.array([0, tokens], np.int32),
                                np.array([context], np.int32), table, out], params))
    return calls


def timed_pass(calls, flush) -> float:
    """µs a layer of one pass, after `flush` streamed through the caches."""
    flush += 1.0
    start = time.perf_counter()
    for call in calls:
        call()
    return 1e6 * (time.perf_counter() - start) / len(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 2048])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--tokens", type=int, default=1, help="new tokens a step (1: decode)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--passes", type=int, default=20)
    args = parser.parse_args()
    os.environ["RADIANCE_THREADS"] = str(args.threads)
    from radiance.engine.loading.registry import Registry

    registry = Registry(radiance_home="")
    try:
        flush = np.zeros(32 << 20, np.float32)  # 128 MB
        rng = np.random.default_rng(0)
        print(f"attention, {args.tokens} new token(s) a step, SmolLM2-135M's heads, {LAYERS} layers of their own "
              f"caches, {args.threads} threads; "
              f"µs a layer, median of {args.passes} passes a round")
        for context in args.contexts:
            calls = {name: layer_calls(registry, context, args.tokens, cache, rng)
                     for name, cache in (("f32", np.float32), ("f16", np.float16))}
            ratios = []
            for round_ in range(args.rounds):
                times = {"f32": [], "f16": []}
                for _ in range(args.passes):
                    for name in ("f32", "f16") if round_ % 2 == 0 else ("f16", "f32"):
                        times[name].append(timed_pass(calls[name], flush))
                f32, f16 = statistics.median(times["f32"]), statistics.median(times["f16"])
                ratios.append(f32 / f16)
                print(f"context {context:5}  round {round_ + 1}:  f32 {f32:8.1f}  f16 {f16:8.1f}  "
                      f"ratio {f32 / f16:5.2f}")
            print(f"context {context:5}  ratio f32 / f16, median of {args.rounds} rounds: "
                  f"{statistics.median(ratios):.2f}", flush=True)
    finally:
        registry.close()


if __name__ == "__main__":
    sys.exit(main())
