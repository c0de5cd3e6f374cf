"""libr4d's device rows on a card: agreement with libref per op, and the speed of the gemm paths.

    CUDA_VISIBLE_DEVICES=0 PYTHONUNBUFFERED=1 python3 bench/device_ops.py [--gemv-only]

Runs where radiance is not installed (checkout_shim maps the checkout). Agreement: the per-op
tests (tests/test_device_rows.py) are the proof; here a summary of max|y - ref| / max|ref| for the
gemm rows. Speed, with CUDA events: the decode GEMV (M = 1, 4, 8)
in GB/s of weight bytes read against the H200's 4.8 TB/s HBM (20 launches queued between two events, so
the host's per-launch overhead overlaps the card's work; a captured graph would hide it likewise), and the prefill GEMM (M = 512) in
TFLOP/s (2*M*N*K), on Llama-3-8B's bf16 layer shapes and their q8_0/q4_1 forms, plus a
device-to-device copy as the measured bandwidth ceiling. Prints a table; writes $OUT/device_ops.json."""

import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0")
from checkout_shim import ROOT  # noqa: E402  (first: maps the checkout under `radiance.`)

sys.path.insert(0, str(ROOT / "tests"))
import numpy as np  # noqa: E402

from radiance.engine.registry import Registry  # noqa: E402
from test_device_rows_support import Card, card  # noqa: E402
from test_libr4d_support import activations, launch, make_weight, rel_err, row_of  # noqa: E402

HBM = 4.8e12
SHAPES = [("gate/up 14336x4096", 14336, 4096), ("down 4096x14336", 4096, 14336),
          ("TP 2 gate/up 7168x4096", 7168, 4096), ("TP 2 q 2048x4096", 2048, 4096), ("TP 2 k/v 512x4096", 512, 4096),
          ("TP 2 o 4096x2048", 4096, 2048)]


def weight_bytes(fmt, n, k):
    return n * k * {"bf16": 2, "f16": 2, "f32": 4, "q8_0": 1 + 2 / 32, "q4_1": 0.5 + 4 / 32}[fmt]


def timed_ms(on_card, row, a, repeats=5, batch=20):
    """Milliseconds per launch: `batch` launches between two events (the queue runs ahead of the
    host's launch overhead, so the card's time is what is measured), median of `repeats`."""
    device, handle = on_card.device, on_card.stream.handle
    for _ in range(3):
        row.info.launch(a)
    times = []
    for _ in range(repeats):
        start, end = device.event(), device.event()
        device.record(start, handle)
        for _ in range(batch):
            row.info.launch(a)
        device.record(end, handle)
        times.append(device.elapsed_ms(start, end) / batch)
    return statistics.median(times)


def copy_ceiling(on_card, nbytes=1 << 30):
    a, b = on_card.alloc(nbytes, "copy a"), on_card.alloc(nbytes, "copy b")
    device, handle = on_card.device, on_card.stream.handle
    device.copy_device(b, a, nbytes, handle)
    start, end = device.event(), device.event()
    device.record(start, handle)
    for _ in range(5):
        device.copy_device(b, a, nbytes, handle)
    device.record(end, handle)
    ms = device.elapsed_ms(start, end) / 5
    return 2 * nbytes / (ms * 1e-3)  # bytes read + written


def main():
    quick = "--gemv-only" in sys.argv[1:]  # bf16 GEMVs at M = 1 and 4 only: the decode path's figures
    device, stream, why = card()
    if device is None:
        print(f"no card: {why}")
        return 1
    registry = Registry(radiance_home="")
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    rows = {row.name: row for row in lib.rows}
    on_card = Card(device, stream)
    results = {"card": getattr(device, "name", "?"), "target": device.target, "gemv": [], "gemm": [], "agreement": []}
    results["copy_read_plus_write_GBps"] = copy_ceiling(on_card) / 1e9
    print(f"card {results['card']} ({device.target}); device-to-device copy {results['copy_read_plus_write_GBps']:.0f} GB/s (read+write)")
    print(f"{'path':34} {'fmt':5} {'M':>4} {'us':>9} {'GB/s':>7} {'%4.8TB/s':>8} {'TFLOP/s':>8} {'rel err':>9}")
    for fmt in ("bf16",) if quick else ("bf16", "q8_0", "q4_1"):
        for label, n, k in SHAPES:
            t0 = time.perf_counter()
            weight = make_weight(fmt, n, k, 1)
            kind = fmt if fmt != "bf16" else "plain"
            for m in (1, 4) if quick else (1, 4, 8, 512):
                name = f"r4dchain_gemv_{kind}_dev" if m <= 8 else f"r4dchain_gemm_{kind}_dev"
                x = activations(m, k, 2)
                params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
                y = np.zeros((m, n), np.float32)
                a = on_card.args(rows[name], [x, None, y], params, {1: weight})
                ms = timed_ms(on_card, rows[name], a)
                got = on_card.download(a.t[2], y)
                err = None
                if m in (1, 8) and fmt == "bf16" or (m == 1):
                    want = np.zeros((m, n), np.float32)
                    assert launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == 0
                    err = rel_err(got, want)
                    results["agreement"].append({"row": name, "fmt": fmt, "shape": label, "M": m, "rel_err": err})
                gbps = weight_bytes(fmt, n, k) / (ms * 1e-3) / 1e9
                tflops = 2 * m * n * k / (ms * 1e-3) / 1e12
                entry = {"row": name, "fmt": fmt, "shape": label, "M": m, "N": n, "K": k, "us": ms * 1e3,
                         "weight_GBps": gbps, "fraction_of_4.8TBps": gbps * 1e9 / HBM, "TFLOPs": tflops, "rel_err": err}
                results["gemv" if m <= 8 else "gemm"].append(entry)
                print(f"{name + ' ' + label:34} {fmt:5} {m:>4} {ms * 1e3:>9.1f} {gbps:>7.0f} {gbps * 1e9 / HBM:>8.1%} "
                      f"{tflops:>8.2f} {'' if err is None else f'{err:.2e}':>9}")
                on_card.close()
            print(f"  ({fmt} {label}: {time.perf_counter() - t0:.1f} s with weight generation and references)")
    registry.close()
    out = os.environ.get("OUT")
    if out:
        Path(out, "device_ops.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({"gemv_best_GBps": max(e["weight_GBps"] for e in results["gemv"]),
                      "gemm_best_TFLOPs": max(e["TFLOPs"] for e in results["gemm"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
