"""The decode attention alone on a card (issue 12): libr4d's fused rope + store + attention row
(`r4dchain_rope_attention_dev`, attention.cu's r4d_attend_fresh) at Llama-3-8B's shape (32 query
heads, 8 kv heads, head_dim 128) against PyTorch's scaled_dot_product_attention in the same run.

    PYTHONUNBUFFERED=1 python3 bench/card_attention.py [--contexts 512 1024 4096 8192] [--batches 1 8]
        [--splits 0 4 8 16 32] [--ahead 2 0] [--no-peer]

For each (context, batch): B sequences each decoding its token at position context - 1 over a
paged cache (16-slot blocks in a shuffled order). radiance: the row's one launch, captured in a
graph as chained launches (bench/device_ops.py's Timer), rotated over enough cache copies that a
round reads at least 4x the 60 MB L2 from HBM (a decode step's 32 layers each read their own
cache); microseconds a launch, the median of 10 replays. Its f32 cache's bytes (k and v) over that
time against 4.8 TB/s; the splits the grid has and a token takes (device_kernels.token_splits);
max |out - libref| / max |libref| of one launch (libr4d's tolerance is 2e-5). `--splits` times
the row again at each of the grid's split counts given (device_kernels.ATT_SPLITS, as
R4D_ATT_SPLITS sets it for a process; 0: attention_splits' own choice), in the same process;
`--ahead` likewise at each number of tiles a block asks into the L2 ahead of its loads
(device_kernels.ATT_AHEAD, R4D_ATT_AHEAD; 0: none), the first of each list the default's line.
radiance's launch also rotates q and this token's k and stores k and v at their slots; the peer
attends only. The peer: torch's SDPA on the same shape, each kv head's 4 query heads taken as 4
query rows (q [B, 8, 4, 128] over k, v [B, 8, context, 128]: a decode token sees every key, so no
mask, and each kv row is read once, as flash-decoding does), restricted to the flash backend in
bf16 (the peer's cache, as bench/torch_peer.py keeps it; half radiance's bytes), and the default
backend in f32 (radiance's bytes); each captured in a CUDA graph over as many copies, microseconds
a call. Where a backend refuses the shape the line says so. Runs where radiance is not installed (checkout_shim); without
PyTorch, radiance's lines alone. Writes $OUT/card_attention.json."""

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

from device_ops import Timer, copies_for  # noqa: E402
from torch_graph_time import graph_ms, torch_or_none  # noqa: E402
from radiance.abi import RadArgs  # noqa: E402
from test_device_rows_support import Card, libr4d_on_card  # noqa: E402
from test_libr4d_support import launch, rel_err, row_of  # noqa: E402

HBM = 4.8e12
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
ROW = "r4dchain_rope_attention_dev"


def decode_operands(batch: int, context: int, rng):
    """The fused row's operands: B sequences, each one token at position context - 1 (its k, v in
    the k, v rows; the cache holds the positions before it), blocks of a shuffled table."""
    per = -(-context // BLOCK)
    blocks = rng.permutation(batch * per).reshape(batch, per).astype(np.int32)
    width = KV_HEADS * HEAD_DIM
    k_cache = rng.standard_normal((batch * per * BLOCK, width), dtype=np.float32)
    v_cache = rng.standard_normal((batch * per * BLOCK, width), dtype=np.float32)
    positions = np.full(batch, context - 1, np.int32)
    slots = np.array([blocks[s, (context - 1) // BLOCK] * BLOCK + (context - 1) % BLOCK for s in range(batch)], np.int32)
    inv_freq = (1.0 / 500000.0 ** (np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM)).astype(np.float32)
    operands = [rng.standard_normal((batch, HEADS * HEAD_DIM), dtype=np.float32),
                rng.standard_normal((batch, width), dtype=np.float32), positions, inv_freq,
                rng.standard_normal((batch, width), dtype=np.float32), k_cache, v_cache, slots,
                np.arange(batch + 1, dtype=np.int32), np.full(batch, context, np.int32), blocks,
                np.zeros((batch, HEADS * HEAD_DIM), np.float32)]
    params = {"M": batch, "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "interleaved": 0,
              "block_size": BLOCK, "scale": 1.0 / np.sqrt(HEAD_DIM), "dtype": "f32"}
    return operands, params


def bench_radiance(on_card, registry, row, timer, dk, batch, context, rng, splits=0, ahead=2) -> dict:
    dk.ATT_SPLITS, dk.ATT_AHEAD = splits or None, ahead  # for the launches planned below
    operands, params = decode_operands(batch, context, rng)
    cache_bytes = 2 * operands[5].nbytes
    first = on_card.args(row, operands, params)
    # the libref check first: one launch on fresh operands (later launches rotate q and k again)
    assert row.info.launch(first) == 0
    got = on_card.download(first.t[11], operands[11])
    want = [np.array(o, copy=True) for o in operands]
    assert launch(row_of(registry, "rope_attention", "libref"), want, params, None) == 0
    err = rel_err(got, want[11])
    copies = copies_for(cache_bytes)
    rest = []
    for _ in range(copies - 1):  # the other copies: their own caches, the rest shared
        tensors = list(first.t)
        tensors[5], tensors[6] = on_card.upload(operands[5]), on_card.upload(operands[6])
        rest.append(RadArgs(t=tuple(tensors), params=first.params, scratch=first.scratch,
                            scratch_bytes=first.scratch_bytes, stream=first.stream))
    ms = timer.ms([lambda a=a: row.info.launch(a) for a in [first, *rest]] * 2)
    grid = dk.attention_splits(batch, KV_HEADS, getattr(on_card.stream, "multiprocessors", 132))
    splits, chunk = dk.token_splits(context, grid)
    on_card.close()
    gbps = cache_bytes / (ms * 1e-3) / 1e9
    return {"us": ms * 1e3, "cache_GBps": gbps, "of_4.8TBps": gbps * 1e9 / HBM, "rel_err": err, "copies": copies,
            "grid_splits": grid, "token_splits": splits, "keys_a_split": chunk, "cache_bytes": cache_bytes}


def bench_torch(batch, context, dtype_name, flash) -> dict:
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, dtype_name)
    generator = torch.Generator(device="cuda").manual_seed(1)
    shape = (batch, KV_HEADS, context, HEAD_DIM)
    q = torch.randn((batch, KV_HEADS, HEADS // KV_HEADS, HEAD_DIM), device="cuda", dtype=dtype, generator=generator)
    cache_bytes = 2 * batch * KV_HEADS * context * HEAD_DIM * q.element_size()
    copies = copies_for(cache_bytes)
    caches = [(torch.randn(shape, device="cuda", dtype=dtype, generator=generator),
               torch.randn(shape, device="cuda", dtype=dtype, generator=generator)) for _ in range(copies)]
    backend = None
    if flash:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = sdpa_kernel(SDPBackend.FLASH_ATTENTION)

    def calls():  # the outputs kept (the graph's pool), no copy kernel beside each call
        return [F.scaled_dot_product_attention(q, keys, values) for keys, values in caches * 2]

    ms = graph_ms(calls, 2 * copies, backend)
    gbps = cache_bytes / (ms * 1e-3) / 1e9
    return {"us": ms * 1e3, "cache_GBps": gbps, "of_4.8TBps": gbps * 1e9 / HBM, "copies": copies}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 4096, 8192])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--splits", type=int, nargs="+", default=[0],
                        help="the grid's splits per (token, kv head), 1..32 each; 0: attention_splits' own")
    parser.add_argument("--ahead", type=int, nargs="+", default=[2],
                        help="tiles a block asks into the L2 ahead of its loads, 0..8 each")
    parser.add_argument("--no-peer", action="store_true", help="radiance's lines alone")
    args = parser.parse_args()
    device, stream, registry, lib = libr4d_on_card()
    row = next(r for r in lib.rows if r.name == ROW)
    dk = importlib.import_module(f"{row.plugin.module.__name__}.device_kernels")
    for splits in args.splits:
        if splits:
            dk.setting("R4D_ATT_SPLITS", str(splits), 1, dk.ATT_MAX_SPLITS)  # refused at once, not after the first cases
    for ahead in args.ahead:
        dk.setting("R4D_ATT_AHEAD", str(ahead), 0, 8)
    on_card = Card(device, stream)
    timer, rng = Timer(on_card), np.random.default_rng(0)
    torch, peer = torch_or_none()
    results = {"card": getattr(device, "name", "?"), "target": device.target, "peer": peer, "cases": []}
    print(f"card {results['card']} ({device.target}); 8B shape: {HEADS} heads, {KV_HEADS} kv heads, head_dim "
          f"{HEAD_DIM}; {peer}", flush=True)
    for context in args.contexts:
        for batch in args.batches:
            case = {"context": context, "batch": batch, "cuts": {}}
            for ahead in args.ahead:
                for splits in args.splits:
                    r = bench_radiance(on_card, registry, row, timer, dk, batch, context, rng, splits, ahead)
                    case["cuts"][f"splits {splits or 'default'}, ahead {ahead}"] = r
                    print(f"  context {context:5} batch {batch}: radiance f32 grid splits {splits or 'default'}, ahead "
                          f"{ahead}: {r['us']:8.2f} us ({r['of_4.8TBps']:6.1%} of 4.8 TB/s, splits {r['token_splits']} "
                          f"of {r['grid_splits']}, err {r['rel_err']:.1e})", flush=True)
            case["radiance"] = r = case["cuts"][next(iter(case["cuts"]))]
            for label, dtype_name, flash in (("torch flash bf16", "bfloat16", True), ("torch sdpa f32", "float32", False)):
                if torch is None or args.no_peer:
                    continue
                try:
                    case[label] = t = bench_torch(batch, context, dtype_name, flash)
                    line = f"{t['us']:8.2f} us ({t['of_4.8TBps']:6.1%}; radiance's first {r['us'] / t['us']:.2f}x)"
                except Exception as error:  # a backend that refuses the shape: said, not fatal
                    case[label] = {"error": f"{type(error).__name__}: {error}"}
                    line = f"{type(error).__name__}: {str(error)[:120]}"
                print(f"  context {context:5} batch {batch}: {label} {line}", flush=True)
            results["cases"].append(case)
    registry.close()
    out = os.environ.get("OUT")
    if out:
        Path(out, "card_attention.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
