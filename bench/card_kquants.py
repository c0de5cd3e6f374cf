"""libr4d's device GEMV rows for the GGUF block types (device_gguf_rows.py, device/gemv_gguf.cu) on a
card, timed as bench/device_ops.py times the others: each row's launches captured in one graph as
chained launches, the weight rotated over enough copies to be read from HBM, the median of 10 replays.

    PYTHONUNBUFFERED=1 python3 bench/card_kquants.py [--m 1,4] [--formats q4_k,q6_k] [--cuts 4x2,8x1,4x4]

For each format at M = 1 (or --m) on Llama-3-8B's linear shapes and Gemma 3 270M's: microseconds a
launch, weight bytes read per second (every plane: codes, scales, minimums), that as a share of
4.8 TB/s, and the peer measured in the same run on the same shape: gemv.cu's q8_0 row (the tuned
GEMV, split K where the shape is narrow): its GB/s and the ratio of the two times per weight byte.
Each timed output is checked against libref (max |y - ref| / max |ref|). The device-to-device
copy is measured first, as the ceiling. --cuts times other cuts of the kernel's work (warps a block x
output rows a warp; device_gguf_rows.WARPS, ROWS: 4x2 is the default) beside it, to choose one.

Runs where radiance is not installed (checkout_shim maps the checkout). Writes $OUT/card_kquants.json."""

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

from checkout_shim import ROOT  # noqa: F401  (first: maps the checkout under `radiance.`)

sys.path.insert(0, str(ROOT / "tests"))
import numpy as np  # noqa: E402

from device_ops import HBM, Timer, copies_for, copy_ceiling, gemv_args  # noqa: E402
from test_device_rows_support import Card, libr4d_on_card  # noqa: E402
from test_libr4d_kquants import TYPES, gguf_weight  # noqa: E402
from test_libr4d_support import launch, make_weight, rel_err, row_of  # noqa: E402

SHAPES = [("8B q/o 4096x4096", 4096, 4096), ("8B k/v 1024x4096", 1024, 4096), ("8B gate/up 14336x4096", 14336, 4096),
          ("8B down 4096x14336", 4096, 14336), ("270M q 1024x640", 1024, 640), ("270M gate/up 2048x640", 2048, 640),
          ("270M o 640x1024", 640, 1024), ("270M down 640x2048", 640, 2048)]
FORMATS = [qtype.name.lower() for qtype in TYPES]


def plane_bytes(weight) -> int:
    return sum(np.asarray(t.data).nbytes for t in weight.planes)


def timed(on_card, registry, timer, row, weight, fmt, m, n, k):
    """(microseconds a launch, weight GB/s, error against libref) of `row` over rotated copies."""
    nbytes = plane_bytes(weight)
    args, x, y, params = gemv_args(on_card, row, weight, m, n, k, fmt, copies_for(nbytes))
    ms = timer.ms([lambda a=a: row.info.launch(a) for a in args] * 2)
    got = on_card.download(args[0].t[2], y)
    want = np.zeros((m, n), np.float32)
    assert launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == 0
    on_card.close()
    return ms * 1e3, nbytes / (ms * 1e-3) / 1e9, rel_err(got, want)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", default="1", help="activation rows, comma-separated (default 1)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="GGUF types, comma-separated")
    parser.add_argument("--cuts", default="", help="warps x rows cuts to time besides the default, e.g. 8x1,4x4")
    args = parser.parse_args()
    device, stream, registry, lib = libr4d_on_card()
    rows = {row.name: row for row in lib.rows}
    gguf_rows = importlib.import_module(f"{lib.module.__name__}.device_gguf_rows")
    default_cut = (gguf_rows.WARPS, gguf_rows.ROWS)
    cuts = [default_cut] + [tuple(int(v) for v in cut.split("x")) for cut in args.cuts.split(",") if cut]
    on_card, started = Card(device, stream), time.perf_counter()
    timer = Timer(on_card)
    results = {"card": getattr(device, "name", "?"), "target": device.target, "gemv": []}
    results["copy_Bps"] = copy_ceiling(on_card)
    print(f"card {results['card']} ({device.target}); device-to-device copy {results['copy_Bps'] / 1e9:.0f} GB/s "
          f"(read + write)", flush=True)
    ms_list = [int(m) for m in args.m.split(",")]
    for label, n, k in SHAPES:
        peer = make_weight("q8_0", n, k, 1)
        for m in ms_list:
            peer_us, peer_gbps, peer_err = timed(on_card, registry, timer, rows["r4dchain_gemv_q8_0_dev"], peer,
                                                 "q8_0", m, n, k)
            print(f"{label:24} M={m}  peer q8_0 (gemv.cu) {peer_us:8.2f} us {peer_gbps:6.0f} GB/s "
                  f"{peer_gbps * 1e9 / HBM:6.1%} of 4.8 TB/s  err {peer_err:.1e}", flush=True)
            for fmt in args.formats.split(","):
                block = 256 if fmt.endswith("_k") else 32
                if k % block:
                    continue
                qtype = next(q for q in TYPES if q.name.lower() == fmt)
                weight = gguf_weight(qtype, n, k, seed=n + k)[0]
                name = f"r4dchain_{'gemv' if m <= 8 else 'gemm'}_{fmt}_dev"
                for warps, per_warp in cuts:
                    gguf_rows.WARPS, gguf_rows.ROWS = warps, per_warp  # the plans read them (a new plan a launch)
                    us, gbps, err = timed(on_card, registry, timer, rows[name], weight, fmt, m, n, k)
                    cut = f"{warps}x{per_warp}"
                    entry = {"shape": label, "fmt": fmt, "M": m, "N": n, "K": k, "cut": cut, "us": us,
                             "weight_GBps": gbps, "of_4.8TBps": gbps * 1e9 / HBM, "of_copy": gbps * 1e9 / results["copy_Bps"],
                             "rel_err": err, "peer_q8_0_us": peer_us, "peer_q8_0_GBps": peer_gbps,
                             "GBps_vs_peer": gbps / peer_gbps}
                    results["gemv"].append(entry)
                    print(f"{'':24} M={m}  {fmt:5} {cut:4} {us:8.2f} us {gbps:6.0f} GB/s {entry['of_4.8TBps']:6.1%} of "
                          f"4.8 TB/s  {entry['GBps_vs_peer']:5.2f}x the peer's GB/s  err {err:.1e}", flush=True)
                gguf_rows.WARPS, gguf_rows.ROWS = default_cut
    registry.close()
    out = os.environ.get("OUT")
    if out:
        Path(out, "card_kquants.json").write_text(json.dumps(results, indent=1))
    at_one = [e["of_4.8TBps"] for e in results["gemv"] if e["M"] == 1 and e["cut"] == "x".join(map(str, default_cut))]
    print(json.dumps({"m1_min_of_hbm": min(at_one, default=None),
                      "m1_median_of_hbm": statistics.median(at_one) if at_one else None,
                      "seconds": time.perf_counter() - started}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
