"""The prefill attention alone on a card (issue 20): libr4d's batch attention row
(`r4dchain_attention_tc_dev`: attention.cu's k, v store, then attention_tiles.cu's r4d_attend_tiles)
at Llama-3-8B's shape (32 query heads, 8 kv heads, head_dim 128) over one causal prompt, against
PyTorch's scaled_dot_product_attention (flash backend, bf16, is_causal) in the same run.

    PYTHONUNBUFFERED=1 python3 bench/card_prefill_attention.py [--tokens 2048 8192] [--repeats 4]
    R4D_AT_PREFILL_WARPS=4 python3 bench/card_prefill_attention.py   # 4-warp prefill tiles, to compare
    python3 bench/card_prefill_attention.py --tokens 2048 512 --cuts all   # attention_tiles.cu's cuts in one run
    python3 bench/card_prefill_attention.py --cuts all --prefill-warps 8 4   # and 4-warp prefill tiles (32 keys)

For each prompt length P: one sequence, its P tokens at positions 0..P-1 in one step, the cache
paged in 16-slot blocks of a shuffled table (f32, as the engine keeps it). radiance: the row's two
launches captured in a graph as chained launches (bench/device_ops.py's Timer), microseconds a row,
the median of 10 replays; TFLOP/s of the causal attention (2 * 2 * P * P * 32 * 128 / 2 flops). The
peer: torch's SDPA on q [1, 32, P, 128], k, v [1, 8, P, 128] in bf16 (GQA by enable_gqa, or k and v
repeated to 32 heads beforehand where this torch lacks it), captured in a CUDA graph; its
microseconds and the ratio. max |out - exact| / max |exact| over 16 sampled tokens (every head)
against float64 (the row's stated tolerance: device_attention_tiles.TOLERANCE). With --cuts, each of
attention_tiles.cu's cuts in turn (device_attention_tiles.CUT set between launches, each its own
compile: 'keys,lazy', or 'all' for device_attention_tiles.CUTS), each against the first cut's time
and the same torch figure; with --prefill-warps 8 4, each cut at 8 warps then at 4
(device_attention_tiles.PREFILL_WARPS set; 4-warp tiles take 32 keys, so only the 32-key cuts).
Runs where radiance
is not installed (checkout_shim); without PyTorch, radiance's lines alone. Writes
$OUT/card_prefill_attention.json."""

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from checkout_shim import ROOT  # noqa: F401  (first: maps the checkout under `radiance.`)

sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
import numpy as np  # noqa: E402

from device_ops import Timer  # noqa: E402
from torch_graph_time import graph_ms, torch_or_none  # noqa: E402
from test_device_rows_support import Card, libr4d_on_card  # noqa: E402
from test_device_tensor_cores import attention_operands  # noqa: E402
from test_libr4d_support import rel_err  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
ROW = "r4dchain_attention_tc_dev"


def flops(tokens: int) -> float:
    return 2 * 2 * tokens * tokens * HEADS * HEAD_DIM / 2


def sampled_exact(operands, params, samples):
    """Exact softmax attention in float64 of the sampled tokens (one prompt from position 0)."""
    q, k, v, k_cache, v_cache, slots, positions, cu, lengths, blocks, _ = operands
    group, d = HEADS // KV_HEADS, HEAD_DIM
    rows = []
    for i in samples:
        seen = np.arange(int(positions[i]) + 1)
        out = np.zeros((HEADS, d))
        for h in range(HEADS):
            kvh = h // group
            keys = k[seen, kvh * d:(kvh + 1) * d].astype(np.float64)  # a prompt from 0: the step's own rows
            values = v[seen, kvh * d:(kvh + 1) * d].astype(np.float64)
            score = keys @ q[i, h * d:(h + 1) * d].astype(np.float64) * params["scale"]
            weights = np.exp(score - score.max())
            out[h] = weights @ values / weights.sum()
        rows.append(out.reshape(-1))
    return np.array(rows)


def bench_radiance(on_card, row, timer, tokens, repeats) -> dict:
    operands, params = attention_operands(HEADS, KV_HEADS, HEAD_DIM, [(0, tokens)], seed=tokens)
    args = on_card.args(row, operands, params)
    assert row.info.launch(args) == 0
    got = on_card.download(args.t[10], operands[10])
    samples = np.unique(np.linspace(0, tokens - 1, 16).astype(int))
    err = rel_err(got[samples], sampled_exact(operands, params, samples))
    ms = timer.ms([lambda: row.info.launch(args)] * repeats)
    return {"us": ms * 1e3, "tflops": flops(tokens) / (ms * 1e-3) / 1e12, "rel_err": err}


def bench_torch(tokens, repeats) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    generator = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn((1, HEADS, tokens, HEAD_DIM), device="cuda", dtype=torch.bfloat16, generator=generator)
    k, v = (torch.randn((1, KV_HEADS, tokens, HEAD_DIM), device="cuda", dtype=torch.bfloat16, generator=generator)
            for _ in range(2))
    try:
        F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        extra, how = {"enable_gqa": True}, "enable_gqa"
    except (TypeError, RuntimeError):
        k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=1) for t in (k, v))
        extra, how = {}, "k, v repeated to 32 heads"

    def calls():
        return [F.scaled_dot_product_attention(q, k, v, is_causal=True, **extra) for _ in range(repeats)]

    ms = graph_ms(calls, repeats, sdpa_kernel(SDPBackend.FLASH_ATTENTION))
    return {"us": ms * 1e3, "tflops": flops(tokens) / (ms * 1e-3) / 1e12, "gqa": how}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--repeats", type=int, default=4, help="launches a graph replay holds")
    parser.add_argument("--cuts", nargs="+", metavar="CUT",
                        help="attention_tiles.cu's cuts to compare, each 'keys,lazy' (device_attention_tiles.Cut), or "
                             "'all' (device_attention_tiles.CUTS); default: the process's own (R4D_AT_CUT, else CUTS[0])")
    parser.add_argument("--prefill-warps", type=int, nargs="+", choices=(8, 4),
                        help="prefill tiles' warps to compare (device_attention_tiles.PREFILL_WARPS); default the process's")
    args = parser.parse_args()
    device, stream, registry, lib = libr4d_on_card()
    row = next(r for r in lib.rows if r.name == ROW)
    at = importlib.import_module(f"{row.plugin.module.__name__}.device_attention_tiles")
    on_card = Card(device, stream)
    timer = Timer(on_card)
    torch, peer = torch_or_none()
    results = {"card": getattr(device, "name", "?"), "target": device.target, "peer": peer,
               "prefill_warps": at.PREFILL_WARPS, "tolerance": at.TOLERANCE, "cases": []}
    print(f"card {results['card']} ({device.target}); 8B shape: {HEADS} heads, {KV_HEADS} kv heads, head_dim "
          f"{HEAD_DIM}; prefill tiles of {at.PREFILL_WARPS} warps; {peer}", flush=True)
    own, own_warps = at.CUT, at.PREFILL_WARPS
    cuts = [own] if not args.cuts else list(at.CUTS) if args.cuts == ["all"] else [at.Cut.parse(c, "--cuts") for c in args.cuts]
    runs = [(w, cut) for w in (args.prefill_warps or [own_warps]) for cut in cuts if w == 8 or cut.keys == at.KEYS]
    for tokens in args.tokens:
        case = {"tokens": tokens, "grid": at.grid(tokens, 1, KV_HEADS, HEADS // KV_HEADS), "cuts": {}}
        first = None
        for warps, cut in runs:
            at.CUT, at.PREFILL_WARPS = cut, warps
            name = f"{cut} w{warps}"
            case["cuts"][name] = c = bench_radiance(on_card, row, timer, tokens, args.repeats)
            first = first or (name, c)
            print(f"  prefill {tokens:5} cut {name:8} (keys,lazy warps): {c['us']:9.1f} us ({c['tflops']:6.1f} TFLOP/s, "
                  f"{first[1]['us'] / c['us']:.2f}x {first[0]}, err {c['rel_err']:.1e} of {at.TOLERANCE:.0e})", flush=True)
        at.CUT, at.PREFILL_WARPS = own, own_warps
        case["radiance"] = r = min(case["cuts"].values(), key=lambda c: c["us"])
        best = min(case["cuts"], key=lambda name: case["cuts"][name]["us"])
        line = (f"  prefill {tokens:5}: radiance {r['us']:9.1f} us ({r['tflops']:6.1f} TFLOP/s, cut {best}, 32 layers "
                f"{32 * r['us'] / 1e3:.1f} ms, err {r['rel_err']:.1e} of {at.TOLERANCE:.0e}, grid {case['grid'][0]})")
        if torch is not None:
            try:
                case["torch flash bf16"] = t = bench_torch(tokens, args.repeats)
                line += (f"  torch flash bf16 {t['us']:9.1f} us ({t['tflops']:6.1f} TFLOP/s, {t['gqa']}); "
                         f"radiance at {t['us'] / r['us']:.2f}x torch's speed")
            except Exception as error:  # a backend that refuses the shape: said, not fatal
                case["torch flash bf16"] = {"error": f"{type(error).__name__}: {error}"}
                line += f"  torch flash bf16: {type(error).__name__}: {str(error)[:120]}"
        print(line, flush=True)
        results["cases"].append(case)
    on_card.close()
    registry.close()
    out = os.environ.get("OUT")
    if out:
        Path(out, "card_prefill_attention.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
