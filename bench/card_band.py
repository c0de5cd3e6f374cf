"""The decode band on a card (issues 12 and 20): one Llama-3-8B layer's GEMVs as a decode step runs them
(the fused rows: rmsnorm + q, k, v; o + add; rmsnorm + gate, up + silu * mul; down + add) and the lm head
(rows taken, normed, 128256 x 4096, greedy), bf16, at M = 1, 2, 4, 8, each row on gemv.cu
(R4D_BAND_KERNEL=gemv) and on the skinny band (device_skinny_band.py: r4d_split_bf16_dev then
gemm_skinny.cu's r4d_skinny_band_bf16; skinny), in the same run.

    source bench/card_setup.sh; python3 bench/card_band.py [--ms 1 2 4 8] [--kernels gemv skinny] [--skip-lm-head]
        [--check-ms 8] [--variants 1,128,4/256 1,128/0 ...] [--variant-ms 8]

Each row's launches captured in one graph as chained launches (bench/device_ops.py's Timer), the
weights rotated over enough copies to be read from HBM, the median of 10 replays: microseconds a row
and a layer, the weights' GB/s and their share of 4.8 TB/s (a layer's bf16 weights are 436 MB: 91 us),
and the skinny band's speed against gemv.cu's; --variants: the skinny band in other cuts and L2 fetches too
(device_tensor_cores.BAND_CUT and BAND_L2 set between rows, each its own compile). Agreement at --check-ms: each row's outputs against libref's
chain (max |y - ref| / max |ref|; the GEMV's tolerance is device_kernels.TOLERANCE["gemv"]), the lm head's
greedy tokens the first maxima of its logits. Runs where
radiance is not installed (checkout_shim). Writes $OUT/card_band.json."""

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

from checkout_shim import ROOT  # noqa: F401  (first: maps the checkout under `radiance.`)

sys.path.insert(0, str(ROOT / "tests"))
import numpy as np  # noqa: E402

from radiance.abi import RadArgs  # noqa: E402
from device_ops import HBM, Timer, copies_for  # noqa: E402
from test_device_rows_support import Card, libr4d_on_card  # noqa: E402
from test_libr4d_support import activations, launch, plain_weight, rel_err, row_of  # noqa: E402

HIDDEN, KV, FFN, VOCAB = 4096, 1024, 14336, 128256


WEIGHTS: dict = {}


def weight(rows: int, cols: int, seed: int, fmt: str = "bf16"):
    """N(0, 0.02) rows as the rows read them, made once for every M (f32 draws: the lm head's 525 M values in
    seconds, not the f64 draws' tens of seconds)."""
    key = (rows, cols, seed, fmt)
    if key not in WEIGHTS:
        values = np.random.default_rng(seed).standard_normal((rows, cols), np.float32)
        values *= np.float32(0.02)
        WEIGHTS[key] = plain_weight(values, fmt)
    return WEIGHTS[key]


def cases(m: int) -> dict:
    """{name: (libr4d row, libref op, operands, params, weights, outputs checked)} of one layer and the lm head."""
    zeros = lambda n: np.zeros((m, n), np.float32)  # noqa: E731
    norm = weight(1, HIDDEN, 3, "f32")
    x = activations(m, HIDDEN, 10)
    return {
        "rmsnorm + q, k, v": (
            "r4dchain_rmsnorm_gemm3_plain_dev", "rmsnorm_gemm3",
            [x, None, zeros(HIDDEN), None, zeros(4096), None, zeros(KV), None, zeros(KV)],
            {"M": m, "n": HIDDEN, "eps": 1e-5, "K": HIDDEN, "N.1": 4096, "N.2": KV, "N.3": KV, "wdtype": "bf16", "dtype": "f32"},
            {1: norm, 3: weight(4096, HIDDEN, 4), 5: weight(KV, HIDDEN, 5), 7: weight(KV, HIDDEN, 6)}, (2, 4, 6, 8)),
        "o + add": (
            "r4dchain_gemm_add_plain_dev", "gemm_add", [activations(m, HIDDEN, 11), None, zeros(HIDDEN), activations(m, HIDDEN, 12)],
            {"M": m, "N": HIDDEN, "K": HIDDEN, "n": HIDDEN, "wdtype": "bf16", "dtype": "f32"},
            {1: weight(HIDDEN, HIDDEN, 7)}, (2,)),
        "rmsnorm + gate, up + silu_mul": (
            "r4dchain_rmsnorm_gemm2_silu_mul_plain_dev", "rmsnorm_gemm2_silu_mul", [x, None, zeros(HIDDEN), None, zeros(FFN), None, zeros(FFN)],
            {"M": m, "n.0": HIDDEN, "eps": 1e-5, "K": HIDDEN, "N.1": FFN, "N.2": FFN, "wdtype": "bf16", "dtype": "f32"},
            {1: norm, 3: weight(FFN, HIDDEN, 8), 5: weight(FFN, HIDDEN, 9)}, (4, 6)),
        "down + add": (
            "r4dchain_gemm_add_plain_dev", "gemm_add", [activations(m, FFN, 13), None, zeros(HIDDEN), activations(m, HIDDEN, 14)],
            {"M": m, "N": HIDDEN, "K": FFN, "n": HIDDEN, "wdtype": "bf16", "dtype": "f32"},
            {1: weight(HIDDEN, FFN, 15)}, (2,)),
        "lm head + greedy": (
            "r4dchain_take_rows_rmsnorm_gemm_sample_plain_dev", "take_rows_rmsnorm_gemm_sample",
            [activations(m, HIDDEN, 16), np.arange(m, dtype=np.int32), zeros(HIDDEN), None, zeros(HIDDEN), None, zeros(VOCAB),
             np.zeros(m, np.float32), np.zeros(m, np.int32), np.ones(m, np.float32), np.zeros((m, 2), np.uint64),
             np.full(m, -1, np.int32)],
            {"M": m, "n": HIDDEN, "eps": 1e-5, "N": VOCAB, "K": HIDDEN, "wdtype": "bf16", "dtype": "f32", "vocab": VOCAB},
            {3: norm, 5: weight(VOCAB, HIDDEN, 17)}, (6, 11)),
    }


def weight_bytes(weights: dict) -> int:
    """The bytes a row streams: its bf16 matrices (a norm's vector is noise)."""
    return sum(2 * w.rows * w.cols for w in weights.values() if w.rows > 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ms", nargs="+", type=int, default=[1, 2, 4, 8], help="activation rows M")
    parser.add_argument("--kernels", nargs="+", choices=("gemv", "skinny"), default=["gemv", "skinny"])
    parser.add_argument("--skip-lm-head", action="store_true", help="the layer's rows alone")
    parser.add_argument("--variants", nargs="*", default=[], metavar="CUT/L2",
                        help="other cuts of the skinny band at --variant-ms: the cut (R4D_BAND_CUT's 'warpgroups,k_bytes[,blocks]') "
                             "and its L2 fetch (R4D_BAND_L2: 0 or 256), e.g. 1,128,4/256 1,128/0")
    parser.add_argument("--variant-ms", nargs="*", type=int, default=[8])
    parser.add_argument("--check-ms", nargs="*", type=int, default=[8],
                        help="the M whose outputs are checked against libref's chains (seconds each on the host)")
    args = parser.parse_args()
    device, stream, registry, lib = libr4d_on_card()
    rows = {row.name: row for row in lib.rows}
    tc = importlib.import_module(f"{lib.module.__name__}.device_tensor_cores")
    dk = importlib.import_module(f"{lib.module.__name__}.device_kernels")
    on_card, started = Card(device, stream), time.perf_counter()
    timer = Timer(on_card)
    results = {"card": getattr(device, "name", "?"), "target": device.target, "rows": []}
    print(f"card {results['card']} ({device.target}); a layer's bf16 weights 436 MB: {436e6 / HBM * 1e6:.1f} us at 4.8 TB/s",
          flush=True)
    default = (str(tc.BAND_CUT), tc.BAND_L2)
    for m in args.ms:
        layer = {}
        timed = [(kernel, kernel, *default) for kernel in args.kernels]
        if m in args.variant_ms:
            timed += [(f"skinny {text}", "skinny", *text.split("/")) for text in args.variants]
        for name, (row_name, op, operands, params, weights, checked) in cases(m).items():
            if name.startswith("lm head") and args.skip_lm_head:
                continue
            row, nbytes = rows[row_name], weight_bytes(weights)
            want = None
            line = []
            for label, kernel, cut, l2 in timed:
                tc.BAND_KERNEL, tc.BAND_CUT, tc.BAND_L2 = kernel, tc.SkinnyCut.parse(str(cut), "--variants"), int(l2)
                served = tc.band_kernel_for(device.vendor, device.target, "bf16", m)
                if served != kernel:
                    continue  # skinny at M = 1 is the bench's to force; elsewhere the card decides
                first = on_card.args(row, operands, params, weights)
                copies = [first] + [RadArgs(t=tuple(on_card.weight(row, weights[i], params) if i in weights and weights[i].rows > 1
                                                    else t for i, t in enumerate(first.t)),
                                            params=first.params, scratch=first.scratch, scratch_bytes=first.scratch_bytes,
                                            stream=first.stream) for _ in range(copies_for(nbytes) - 1)]
                ms = timer.ms([lambda a=a: row.info.launch(a) for a in copies] * 2)
                got = {i: on_card.download(first.t[i], operands[i]) for i in checked}
                err = None
                if m in args.check_ms:
                    if want is None:
                        arrays = [None if i in weights else np.array(o, copy=True) for i, o in enumerate(operands)]
                        assert launch(row_of(registry, op, "libref"), arrays, params, weights) == 0
                        want = arrays
                    err = max(rel_err(got[i], want[i]) for i in checked if i != 11)
                    if 11 in checked:
                        assert np.array_equal(got[11], np.argmax(got[6], axis=1)), "greedy tokens: the logits' first maximum"
                gbps = nbytes / (ms * 1e-3) / 1e9
                entry = {"row": name, "M": m, "kernel": label, "cut": str(cut), "l2": int(l2), "us": ms * 1e3,
                         "weight_GBps": gbps, "of_4.8TBps": gbps * 1e9 / HBM, "rel_err": err}
                results["rows"].append(entry)
                if not name.startswith("lm head"):
                    layer[label] = layer.get(label, 0.0) + ms * 1e3
                line.append(f"{label} {ms * 1e3:8.2f} us {entry['of_4.8TBps']:6.1%}" + (f" err {err:.1e}" if err is not None else ""))
                on_card.close()
            speed = {e["kernel"]: e["us"] for e in results["rows"] if e["row"] == name and e["M"] == m}
            ratio = f"  skinny {speed['gemv'] / speed['skinny']:.2f}x gemv.cu" if {"gemv", "skinny"} <= set(speed) else ""
            print(f"  M={m} {name:30} " + "   ".join(line) + ratio, flush=True)
        for kernel, us in layer.items():
            results.setdefault("layer", []).append({"M": m, "kernel": kernel, "us": us, "of_4.8TBps": 436e6 / HBM * 1e6 / us})
        summary = "   ".join(f"{kernel} {us:7.1f} us ({436e6 / HBM * 1e6 / us:5.1%} of 4.8 TB/s)" for kernel, us in layer.items())
        if {"gemv", "skinny"} <= set(layer):
            summary += f"   skinny {layer['gemv'] / layer['skinny']:.2f}x gemv.cu"
        print(f"LAYER M={m}: {summary}", flush=True)
    tc.BAND_KERNEL, tc.BAND_CUT, tc.BAND_L2 = None, tc.SkinnyCut.parse(default[0]), default[1]
    registry.close()
    results["seconds"] = time.perf_counter() - started
    out = os.environ.get("OUT")
    if out:
        Path(out, "card_band.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({"seconds": results["seconds"], "gemv_tolerance": dk.TOLERANCE["gemv"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
