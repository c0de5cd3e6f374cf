"""The decode attention of batches alone on a card (issue 20): libr4d's batch attention row
(`r4dchain_attention_tc_dev`) on a decode step (one token a sequence), which runs
attention_decode.cu's r4d_attend_decode, against the bound of its KV bytes, against the same row with
that kernel set aside (device_attention_decode.ENABLED off: attention_tiles.cu's tiles, the path
before it) and against PyTorch, all in the same run, at Llama-3-8B's shape (32 query heads, 8 kv
heads, head_dim 128).

    PYTHONUNBUFFERED=1 python3 bench/card_decode_attention.py [--batches 8 32 64] [--contexts 1024 4096 mixed]
        [--sweep]    # also each chunk of CHUNKS, R4D_AD_KEYS=2 and R4D_AD_AHEAD=1, at every case

At batch 8 and below (the decode band, where the engine fuses rope into attention) also the fused
rope_attention row both ways: r4d_attend_decode_rope against attention.cu's r4d_attend_fresh, the
kernel the engine runs there before (and at batch 1 still: device_attention_decode.BAND_FROM).

A case is B sequences, each one decode token at its last position (contexts all C, or `mixed`: spread
evenly from 64 to 8192), the cache f32 (as the engine keeps it on a card) paged in 16-slot blocks of a
shuffled table. radiance: the row's launch captured in a graph as a chained launch (bench/device_ops.py's
Timer), the layers' caches taken in turn where one layer's would sit in the L2 (at least 512 MB read
between two reads of one cache), microseconds a layer (the median of 10 replays), TB/s of the KV bytes
it must read (keys and values of every visible position, f32) and the fraction of 4.8 TB/s. The
peer: torch's scaled_dot_product_attention in bf16 on q [B, 8, 4, 128] (the 4 query heads of a kv
head as its rows, so each kv head's keys are read once for them) over a gathered contiguous cache
[B, 8, L, 128] of the longest context L (a mask where the contexts differ), captured in a CUDA graph,
its µs and the ratio. max |out - exact| / max |exact| of 4 sampled sequences against float64. Writes
$OUT/card_decode_attention.json."""

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
from test_libr4d_support import rel_err  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
ROW, FUSED = "r4dchain_attention_tc_dev", "r4dchain_rope_attention_dev"
BANDWIDTH = 4.8e12   # an H200's HBM3e, bytes a second
APART = 512 << 20    # bytes read between two reads of one layer's cache
CHUNKS = (64, 128, 256, 512)


def contexts_of(batch: int, context: str) -> list:
    if context == "mixed":
        return [int(c) for c in np.linspace(64, 8192, batch)] if batch > 1 else [8192]
    return [int(context)] * batch


def kv_bytes(contexts) -> int:
    return sum(contexts) * KV_HEADS * HEAD_DIM * 2 * 4  # keys and values, f32


PATTERN = 4099  # rows of the random block the caches repeat (prime: no aligned repeats)


class Tiled:
    """A cache of `rows` rows that repeats `pattern` (row r is pattern[r % PATTERN]): made on the card
    by one upload and copies doubling what is there (gigabytes in milliseconds; the values do not change
    the time), read back on the host by index."""

    def __init__(self, pattern: np.ndarray, rows: int):
        self.pattern, self.rows = pattern, rows

    def __getitem__(self, where):
        return self.pattern[np.asarray(where) % PATTERN]

    def on_card(self, on_card):
        from radiance.abi import RAD_DT_F32, rad_device_tensor
        row_bytes = self.pattern.shape[1] * 4
        address = on_card.alloc(self.rows * row_bytes, "cache")
        first = min(self.rows, PATTERN)
        on_card.device.copy_to_device(address, np.ascontiguousarray(self.pattern[:first]), on_card.stream.handle)
        filled = first
        while filled < self.rows:
            count = min(filled, self.rows - filled)
            on_card.device.copy_device(address + filled * row_bytes, address, count * row_bytes, on_card.stream.handle)
            filled += count
        on_card.device.synchronize(on_card.stream.handle)
        return rad_device_tensor(address, RAD_DT_F32, (self.rows, self.pattern.shape[1]), 4)


def operands_for(contexts, seed):
    """The row's operands for one decode token a sequence, the caches as Tiled (see there)."""
    rng = np.random.default_rng(seed)
    seqs, width = len(contexts), KV_HEADS * HEAD_DIM
    max_blocks = -(-max(contexts) // BLOCK)
    table = rng.permutation(seqs * max_blocks).astype(np.int32).reshape(seqs, max_blocks)
    slots_total = seqs * max_blocks * BLOCK
    pattern = rng.standard_normal((PATTERN, width)).astype(np.float32)
    caches = [Tiled(np.roll(pattern, shift, axis=0), slots_total) for shift in (0, 7)]
    positions = np.array([c - 1 for c in contexts], np.int32)
    slots = np.array([table[s, p // BLOCK] * BLOCK + p % BLOCK for s, p in enumerate(positions)], np.int32)
    operands = [rng.standard_normal((seqs, HEADS * HEAD_DIM)).astype(np.float32),
                rng.standard_normal((seqs, width)).astype(np.float32), rng.standard_normal((seqs, width)).astype(np.float32),
                caches[0], caches[1], slots, positions, np.arange(seqs + 1, dtype=np.int32),
                np.array(contexts, np.int32), table, np.zeros((seqs, HEADS * HEAD_DIM), np.float32)]
    params = {"M": seqs, "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "block_size": BLOCK,
              "scale": 1.0 / np.sqrt(HEAD_DIM), "dtype": "f32", "seqs": seqs}
    return operands, params


def exact(operands, params, sample):
    """float64 attention of the sampled sequences (their own k, v at their last position)."""
    q, k, v, k_cache, v_cache, slots, positions, cu, lengths, blocks, _ = operands
    group, d, rows = HEADS // KV_HEADS, HEAD_DIM, []
    for s in sample:
        seen = np.arange(int(lengths[s]))
        where = blocks[s, seen // BLOCK] * BLOCK + seen % BLOCK
        keys, values = k_cache[where].astype(np.float64), v_cache[where].astype(np.float64)  # Tiled: by index
        keys[-1], values[-1] = k[s], v[s]
        out = np.zeros((HEADS, d))
        for h in range(HEADS):
            kvh = h // group
            score = keys[:, kvh * d:(kvh + 1) * d] @ q[s, h * d:(h + 1) * d].astype(np.float64) * params["scale"]
            weights = np.exp(score - score.max())
            out[h] = weights @ values[:, kvh * d:(kvh + 1) * d] / weights.sum()
        rows.append(out.reshape(-1))
    return np.array(rows)


def bench_radiance(on_card, row, timer, sets, params, bytes_read, check=None) -> dict:
    """µs a layer over the operand sets in turn; the first set's output checked where `check` is
    (operands, sample)."""
    args = [on_card.args(row, operands, params) for operands in sets]
    result = {}
    if check is not None:
        operands, sample = check
        assert row.info.launch(args[0]) == 0
        got = on_card.download(args[0].t[10], operands[10])
        result["rel_err"] = rel_err(got[sample], exact(operands, params, sample))
    launches = [lambda a=a: row.info.launch(a) for a in args] * max(1, 8 // len(args))
    ms = timer.ms(launches)
    return {**result, "us": ms * 1e3, "tbs": bytes_read / (ms * 1e-3) / 1e12,
            "of_bound": bytes_read / BANDWIDTH / (ms * 1e-3)}


def fused_sets(sets, params):
    """The fused rope_attention row's operands of each set (rope's frequencies of theta 500000)."""
    inv_freq = (1.0 / 500000.0 ** (np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM)).astype(np.float32)
    fused = [[q, k, positions, inv_freq, v, k_cache, v_cache, slots, cu, lengths, blocks, out]
             for q, k, v, k_cache, v_cache, slots, positions, cu, lengths, blocks, out in sets]
    return fused, {**{key: value for key, value in params.items() if key != "seqs"}, "interleaved": 0}


def bench_torch(contexts, copies) -> dict:
    import torch
    import torch.nn.functional as F

    batch, longest, group = len(contexts), max(contexts), HEADS // KV_HEADS
    generator = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn((batch, KV_HEADS, group, HEAD_DIM), device="cuda", dtype=torch.bfloat16, generator=generator)
    caches = [[torch.randn((batch, KV_HEADS, longest, HEAD_DIM), device="cuda", dtype=torch.bfloat16,
                           generator=generator) for _ in range(2)] for _ in range(copies)]
    mask = None
    if min(contexts) != longest:
        lengths = torch.tensor(contexts, device="cuda")
        mask = (torch.arange(longest, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
    launches = max(copies, 4)

    def calls():
        return [F.scaled_dot_product_attention(q, *caches[i % copies], attn_mask=mask) for i in range(launches)]

    ms = graph_ms(calls, launches)
    read = batch * KV_HEADS * longest * HEAD_DIM * 2 * 2
    return {"us": ms * 1e3, "tbs": read / (ms * 1e-3) / 1e12, "bf16_bytes": read}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--contexts", nargs="+", default=["1024", "mixed", "4096"])
    parser.add_argument("--sweep", action="store_true", help="also each chunk of CHUNKS, 2 keys a stream, 1 ahead")
    args = parser.parse_args()
    device, stream, registry, lib = libr4d_on_card()
    row = next(r for r in lib.rows if r.name == ROW)
    fused_row = next(r for r in lib.rows if r.name == FUSED)
    ad = importlib.import_module(f"{row.plugin.module.__name__}.device_attention_decode")
    on_card = Card(device, stream)
    timer = Timer(on_card)
    torch, peer = torch_or_none()
    results = {"card": getattr(device, "name", "?"), "target": device.target, "peer": peer, "cases": []}
    print(f"card {results['card']} ({device.target}); 8B shape: {HEADS} heads, {KV_HEADS} kv heads, head_dim "
          f"{HEAD_DIM}, f32 cache; bound {BANDWIDTH / 1e12:.1f} TB/s; {peer}", flush=True)
    out = os.environ.get("OUT")
    for context in args.contexts:  # context by context: a run cut short has every batch of the first
        for batch in args.batches:
            contexts = contexts_of(batch, context)
            bytes_read = kv_bytes(contexts)
            copies = max(1, min(4, -(-APART // bytes_read)))
            operands, params = operands_for(contexts, seed=batch)
            uploaded = [cache.on_card(on_card) for cache in operands[3:5]]
            sets = [operands[:3] + uploaded + operands[5:]]
            for extra in range(1, copies):  # other layers' caches
                more, _ = operands_for(contexts, seed=batch + 100 * extra)
                sets.append(more[:3] + [cache.on_card(on_card) for cache in more[3:5]] + more[5:])
            sample = sorted({0, batch // 3, 2 * batch // 3, batch - 1})
            name = f"batch {batch:2} context {context:>5}"
            case = {"batch": batch, "context": context, "kv_bytes": bytes_read, "layers": copies,
                    "grid": ad.grid(batch, KV_HEADS, operands[9].shape[1] * BLOCK), "chunk": ad.chunk(batch, KV_HEADS)}
            case["radiance"] = r = bench_radiance(on_card, row, timer, sets, params, bytes_read, (operands, sample))
            line = (f"  {name}: decode {r['us']:8.1f} us ({r['tbs']:.2f} TB/s, {100 * r['of_bound']:3.0f}% of the bound;"
                    f" err {r['rel_err']:.1e}; grid {case['grid'][0]}, chunk {case['chunk']})")
            ad.ENABLED = False
            try:
                case["tiles"] = t = bench_radiance(on_card, row, timer, sets, params, bytes_read)
                line += f"  tiles {t['us']:8.1f} us ({t['us'] / r['us']:.2f}x)"
            finally:
                ad.ENABLED = True
            if torch is not None:
                try:
                    case["torch sdpa bf16"] = p = bench_torch(contexts, copies)
                    line += f"  torch sdpa bf16 {p['us']:8.1f} us; radiance at {p['us'] / r['us']:.2f}x torch's speed"
                except Exception as error:  # a backend that refuses the shape: said, not fatal
                    case["torch sdpa bf16"] = {"error": f"{type(error).__name__}: {error}"}
                    line += f"  torch: {type(error).__name__}: {str(error)[:100]}"
            if batch <= 8:  # the decode band's fused row, both kernels
                fused, fused_params = fused_sets(sets, params)
                band_from, ad.BAND_FROM = ad.BAND_FROM, 1  # batch 1 too
                try:
                    case["fused"] = f = bench_radiance(on_card, fused_row, timer, fused, fused_params, bytes_read)
                finally:
                    ad.BAND_FROM = band_from
                line += f"\n      fused rope_attention: decode kernel {f['us']:8.1f} us ({100 * f['of_bound']:3.0f}%)"
                ad.ENABLED = False
                try:
                    case["fused attention.cu"] = c = bench_radiance(on_card, fused_row, timer, fused, fused_params,
                                                                    bytes_read)
                    line += f", attention.cu {c['us']:8.1f} us ({c['us'] / f['us']:.2f}x)"
                except Exception as error:  # said, not fatal: the other figures stand
                    line += f", attention.cu: {type(error).__name__}: {str(error)[:100]}"
                finally:
                    ad.ENABLED = True
            print(line, flush=True)
            if args.sweep:
                sweep = {}
                for chunk in CHUNKS:
                    ad.CHUNK = chunk
                    try:
                        sweep[f"chunk {chunk}"] = bench_radiance(on_card, row, timer, sets, params, bytes_read)["us"]
                    finally:
                        ad.CHUNK = None
                for name, value in (("KEYS", 2), ("AHEAD", 1)):
                    before = getattr(ad, name)
                    setattr(ad, name, value)
                    try:
                        sweep[f"{name.lower()} {value}"] = bench_radiance(on_card, row, timer, sets, params, bytes_read)["us"]
                    finally:
                        setattr(ad, name, before)
                case["sweep_us"] = sweep
                print("      sweep (us): " + ", ".join(f"{k} {v:.1f}" for k, v in sweep.items()), flush=True)
            results["cases"].append(case)
            on_card.close()
            if out:  # after every case: a run cut short keeps what it measured
                Path(out, "card_decode_attention.json").write_text(json.dumps(results, indent=1))
    registry.close()
    print("summary (us a layer; % of 4.8 TB/s in f32 KV bytes; the others' time over the decode kernel's):")
    for case in results["cases"]:
        r, t, p = case["radiance"], case.get("tiles", {}), case.get("torch sdpa bf16", {})
        fused = case.get("fused attention.cu")
        print(f"  batch {case['batch']:2} context {case['context']:>5}: {r['us']:8.1f} us {100 * r['of_bound']:3.0f}%"
              + (f"  tiles {t['us'] / r['us']:.2f}x" if "us" in t else "")
              + (f"  torch bf16 {p['us'] / r['us']:.2f}x" if "us" in p else "")
              + (f"  fused: attention.cu {fused['us'] / case['fused']['us']:.2f}x" if fused else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
