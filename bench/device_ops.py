"""libr4d's decode GEMVs and fused rows on a card, timed as a decode step runs them: each row's
launches captured in one graph as chained (programmatic dependent) launches, the weights rotated
over enough copies to be read from HBM, not from the 60 MB L2; the median of 10 replays, per launch.

    PYTHONUNBUFFERED=1 python3 bench/device_ops.py [--sweep] [--quick]

- GEMV bandwidth at M = 1, 2, 4, 8 on every Llama-3-8B linear shape (bf16, q8_0, q4_1; fp8_channel
  when --formats asks, with --fp8-bits its codes also decoded by r4d_fp8's bit tricks, gemv.cu
  compiled with -DR4D_FP8_CVT=0, beside the card's conversion): weight
  bytes read per second, against 4.8 TB/s and against the device-to-device copy measured first;
  the kernel the row picks (gemv.cu; gemv_stream.cu where R4D_GEMV_STREAM asks for it and it
  serves) and, with --both, the two side by side.
- The fused rows against the launches they replace: rmsnorm + q, k, v (rmsnorm_gemm3), rmsnorm +
  gate, up + silu_mul (rmsnorm_gemm2_silu_mul), o + add (gemm_add), bf16; --skip-fused leaves them out.
- --sweep: gemv_stream.cu's cut of the work (device_kernels.StreamShape: warps a block, steps in
  flight, units prefetched ahead) at M = 1 on one 8B layer's bf16 GEMVs, to choose the default; the
  GEMVs after it use the fastest cut.
- Agreement with libref for every timed GEMV (max |y - ref| / max |ref|).

Runs where radiance is not installed (checkout_shim maps the checkout). Writes $OUT/device_ops.json."""

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

from radiance.abi import RadArgs  # noqa: E402
from device_batch_support import fp8_weight  # noqa: E402
from test_device_rows_support import Card, libr4d_on_card  # noqa: E402
from test_libr4d_support import activations, launch, make_weight, rel_err, row_of  # noqa: E402

HBM = 4.8e12
DEVICE_ROWS = []  # libr4d's device_rows module, as the registry loaded it
L2_BYTES = 60 << 20
SHAPES = [("q/o 4096x4096", 4096, 4096), ("k/v 1024x4096", 1024, 4096), ("gate/up 14336x4096", 14336, 4096),
          ("down 4096x14336", 4096, 14336), ("lm head 128256x4096", 128256, 4096)]
# one 8B layer's GEMVs at TP 1 as the fused rows run them: q, k, v in one; o; gate and up in one; down
SWEEP_SHAPES = [("qkv 6144x4096", 6144, 4096), ("o 4096x4096", 4096, 4096), ("gate+up 28672x4096", 28672, 4096),
                ("down 4096x14336", 4096, 14336)]


def weight_bytes(fmt, n, k):
    if fmt == "fp8_channel":  # a code an element, an f32 scale a row
        return n * k + 4 * n
    return n * k * {"bf16": 2, "f16": 2, "f32": 4, "q8_0": 1 + 2 / 32, "q4_1": 0.5 + 4 / 32}[fmt]


def label_of(fmt):
    return fmt if fmt in ("q4_1", "q8_0") else "fp8" if fmt == "fp8_channel" else "plain"


def weight_of(registry, fmt, n, k, seed):
    """A weight as the rows read it: fp8_channel through the fp8 quantiser, as rad-convert writes it."""
    return fp8_weight(registry, n, k, seed) if fmt == "fp8_channel" else make_weight(fmt, n, k, seed)


class Timer:
    """Launch functions captured into one graph (chained, as the executor launches r4dchain rows)
    and replayed; milliseconds per launch, the median of `repeats` replays."""

    def __init__(self, on_card):
        self.on_card = on_card

    def ms(self, launches, repeats=10) -> float:
        device, stream = self.on_card.device, self.on_card.stream
        handle = stream.handle
        for issue in launches[:2]:
            issue()  # compile, load and plan outside the capture
        device.synchronize(handle)
        device.begin_capture(handle)
        try:
            stream.programmatic = device.programmatic_launch
            for issue in launches:
                issue()
        finally:
            stream.programmatic = False
            graph = device.instantiate(device.end_capture(handle))
        device.launch_graph(graph, handle)
        device.synchronize(handle)
        times = []
        for _ in range(repeats):
            start, end = device.event(), device.event()
            device.record(start, handle)
            device.launch_graph(graph, handle)
            device.record(end, handle)
            times.append(device.elapsed_ms(start, end) / len(launches))
        return statistics.median(times)


def copies_for(nbytes: int) -> int:
    """Copies of a weight so that a round over them reads at least 4x the L2 from HBM."""
    return max(2, min(64, -(-4 * L2_BYTES // max(1, int(nbytes)))))


def gemv_args(on_card, row, weight, m, n, k, fmt, copies):
    """One RadArgs per weight copy (the activations and output shared), and the first's output."""
    x = activations(m, k, 2)
    y = np.zeros((m, n), np.float32)
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    first = on_card.args(row, [x, None, y], params, {1: weight})
    rest = [RadArgs(t=(first.t[0], on_card.weight(row, weight, params), first.t[2]), params=first.params,
                    scratch=first.scratch, scratch_bytes=first.scratch_bytes, stream=first.stream)
            for _ in range(copies - 1)]
    return [first, *rest], x, y, params


def issuer(on_card, stream_shape, fp8_bits=False):
    """A launch of the GEMV row's one kernel through device_rows.gemv_step, with gemv_stream.cu cut
    as `stream_shape` (None: gemv.cu, split K where the shape is narrow); `fp8_bits`: e4m3 codes
    decoded by r4d_fp8's shifts, masks and multiply (common.cu's R4D_FP8_CVT=0), not the card's conversion."""
    device_rows = DEVICE_ROWS[0]
    stream = on_card.stream

    def issue(a):
        step = device_rows.gemv_step(a, device_rows._address(a.t[0]), [(a.t[1], device_rows._address(a.t[2]))],
                                     scratch=int(a.scratch or 0), scratch_bytes=a.scratch_bytes,
                                     stream_shape=stream_shape)
        options = tuple(step.options) + (("-DR4D_FP8_CVT=0",) if fp8_bits else ())
        kernel = stream.kernel(device_rows.dk.source(step.source), step.kernel, options)
        stream.launch(kernel, step.grid, step.block, step.args.pack(), step.shared)
        return step.source
    return issue


def bench_gemv(on_card, registry, rows, timer, fmt, label, n, k, ms_list, results, kernels, stream_shape=None,
               fp8_bits=False):
    weight = weight_of(registry, fmt, n, k, 1)
    row = rows[f"r4dchain_gemv_{label_of(fmt)}_dev"]
    copies = copies_for(weight_bytes(fmt, n, k))
    for m in ms_list:
        for kernel in kernels:
            args, x, y, params = gemv_args(on_card, row, weight, m, n, k, fmt, copies)
            issue = issuer(on_card, None if kernel == "split" else (stream_shape or STREAM_DEFAULT()), fp8_bits)
            source = issue(args[0])
            if kernel != source.replace("gemv_stream", "stream").replace("gemv", "split"):
                on_card.close()
                continue  # the stream kernel does not serve this M or shape
            ms = timer.ms([lambda a=a: issue(a) for a in args] * 2)
            got = on_card.download(args[0].t[2], y)
            want = np.zeros((m, n), np.float32)
            assert launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == 0
            err = rel_err(got, want)
            gbps = weight_bytes(fmt, n, k) / (ms * 1e-3) / 1e9
            entry = {"fmt": fmt, "shape": label, "M": m, "N": n, "K": k, "kernel": kernel, "us": ms * 1e3,
                     "weight_GBps": gbps, "of_4.8TBps": gbps * 1e9 / HBM, "of_copy": gbps * 1e9 / results["copy_Bps"],
                     "rel_err": err}
            shown = kernel
            if fmt == "fp8_channel":  # how its codes were decoded, the card's conversion or r4d_fp8's bits
                entry["fp8_decode"] = shown = "bits" if fp8_bits else "cvt"
            results["gemv"].append(entry)
            print(f"  gemv {fmt:5} {label:22} M={m} {shown:6} {ms * 1e3:8.2f} us  {gbps:6.0f} GB/s  "
                  f"{entry['of_4.8TBps']:6.1%} of 4.8 TB/s  {entry['of_copy']:6.1%} of the copy  err {err:.1e}", flush=True)
            on_card.close()


def STREAM_DEFAULT():
    """The cut R4D_GEMV_STREAM asks for, else gemv_stream.cu's default cut."""
    dk = DEVICE_ROWS[0].dk
    return dk.STREAM or dk.StreamShape()


def sweep(on_card, registry, rows, timer, results):
    dk = DEVICE_ROWS[0].dk.StreamShape
    shapes = [dk(*cut) for cut in [(4, 4, 2, 6, 0), (4, 4, 4, 3, 0), (4, 3, 2, 8, 0), (4, 2, 2, 12, 0), (4, 4, 2, 4, 0),
                                   (4, 3, 4, 4, 0), (8, 2, 2, 6, 0), (4, 4, 2, 6, 1), (4, 2, 4, 6, 0), (8, 1, 2, 12, 0)]]
    best = {}
    for fmt in ("bf16",):
        for label, n, k in SWEEP_SHAPES:
            for m in (1,):
                line = []
                for shape in shapes:
                    entries = len(results["gemv"])
                    try:
                        bench_gemv(on_card, registry, rows, timer, fmt, label, n, k, [m], results, ["stream"], shape)
                    except Exception as error:  # a cut the compiler or the card refuses: named, skipped
                        print(f"  sweep {shape}: {type(error).__name__}: {error}", flush=True)
                        on_card.close()
                        continue
                    for entry in results["gemv"][entries:]:
                        cut = f"{shape.warps},{shape.blocks},{shape.unit},{shape.depth},{shape.ahead}"
                        entry.update(cut=cut, sweep=True)
                        line.append(f"{cut}:{entry['weight_GBps']:5.0f}")
                        best[cut] = best.get(cut, 0.0) + entry["us"]
                print(f"  sweep {fmt:5} {label:20} M={m}  (warps,blocks,unit,depth,ahead: GB/s)  " + "  ".join(line),
                      flush=True)
    # the cut that reads one layer's shapes fastest (a cut missing a shape counts as never best)
    complete = {cut: us for cut, us in best.items()
                if sum(1 for e in results["gemv"] if e.get("cut") == cut) == len(SWEEP_SHAPES)}
    if complete:
        results["best_cut"] = min(complete, key=complete.get)
        print(f"  sweep best cut {results['best_cut']}: {complete[results['best_cut']]:.1f} us over the shapes", flush=True)


def bench_fused(on_card, registry, rows, timer, results):
    """The fused rows of one 8B layer (bf16) against the unfused rows' launches, M = 1."""
    h, k, ffn, kv = 4096, 4096, 14336, 1024
    m = 1
    norm = make_weight("f32", 1, h, 3)
    wq, wk, wv = make_weight("bf16", 4096, h, 4), make_weight("bf16", kv, h, 5), make_weight("bf16", kv, h, 6)
    wg, wu, wd = make_weight("bf16", ffn, h, 7), make_weight("bf16", ffn, h, 8), make_weight("bf16", h, ffn, 9)
    zeros = lambda n: np.zeros((m, n), np.float32)  # noqa: E731
    x = activations(m, h, 10)
    cases = {
        "rmsnorm + q, k, v": ("r4dchain_rmsnorm_gemm3_plain_dev", [x, None, zeros(h), None, zeros(4096), None, zeros(kv),
                                                                    None, zeros(kv)],
                              {"M": m, "n": h, "eps": 1e-5, "K": h, "N.1": 4096, "N.2": kv, "N.3": kv,
                               "wdtype": "bf16", "dtype": "f32"}, {1: norm, 3: wq, 5: wk, 7: wv},
                              [("r4dchain_rmsnorm_dev", "n", h, None), ("gemv", 4096, h, wq), ("gemv", kv, h, wk),
                               ("gemv", kv, h, wv)]),
        "rmsnorm + gate, up + silu_mul": ("r4dchain_rmsnorm_gemm2_silu_mul_plain_dev",
                                          [x, None, zeros(h), None, zeros(ffn), None, zeros(ffn)],
                                          {"M": m, "n.0": h, "eps": 1e-5, "K": h, "N.1": ffn, "N.2": ffn,
                                           "wdtype": "bf16", "dtype": "f32"}, {1: norm, 3: wg, 5: wu},
                                          [("r4dchain_rmsnorm_dev", "n", h, None), ("gemv", ffn, h, wg),
                                           ("gemv", ffn, h, wu), ("r4dchain_silu_mul_dev", "n", ffn, None)]),
        "down + add": ("r4dchain_gemm_add_plain_dev", [activations(m, ffn, 11), None, zeros(h), activations(m, h, 12)],
                       {"M": m, "N": h, "K": ffn, "n": h, "wdtype": "bf16", "dtype": "f32"}, {1: wd},
                       [("gemv", h, ffn, wd), ("r4dchain_add_dev", "n", h, None)]),
    }
    for name, (fused, operands, params, weights, parts) in cases.items():
        row = rows[fused]
        a = on_card.args(row, operands, params, weights)
        fused_ms = timer.ms([lambda: row.info.launch(a)] * 8)
        unfused = []
        for part, n_or_key, extent, weight in parts:
            if part == "gemv":
                prow = rows["r4dchain_gemv_plain_dev"]
                pa = on_card.args(prow, [activations(m, extent, 13), None, zeros(n_or_key)],
                                  {"M": m, "N": n_or_key, "K": extent, "wdtype": "bf16", "dtype": "f32", "split_k": 1},
                                  {1: weight})
            elif part == "r4dchain_rmsnorm_dev":
                prow = rows[part]
                pa = on_card.args(prow, [x, None, zeros(extent)], {"M": m, "n": extent, "eps": 1e-5, "dtype": "f32"},
                                  {1: norm})
            else:
                prow = rows[part]
                pa = on_card.args(prow, [zeros(extent), zeros(extent), zeros(extent)],
                                  {"M": m, "n": extent, "dtype": "f32"})
            unfused.append(lambda prow=prow, pa=pa: prow.info.launch(pa))
        unfused_ms = timer.ms(unfused * 8) * len(parts)
        results["fused"].append({"chain": name, "fused_us": fused_ms * 1e3, "unfused_us": unfused_ms * 1e3})
        print(f"  fused {name:32} {fused_ms * 1e3:8.2f} us   the {len(parts)} launches it replaces "
              f"{unfused_ms * 1e3:8.2f} us", flush=True)
        on_card.close()


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
    on_card.close()
    return 2 * nbytes / (ms * 1e-3)  # bytes read + written


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", action="store_true", help="time other cuts of the GEMV's work first")
    parser.add_argument("--quick", action="store_true", help="bf16 only, M = 1 and 8")
    parser.add_argument("--both", action="store_true", help="time gemv_stream.cu beside gemv.cu where both serve")
    parser.add_argument("--formats", nargs="+", choices=("bf16", "q8_0", "q4_1", "fp8_channel"),
                        help="the GEMVs' weight formats (default bf16 q8_0 q4_1; --quick: bf16)")
    parser.add_argument("--fp8-bits", action="store_true",
                        help="fp8_channel: each GEMV also with -DR4D_FP8_CVT=0 (r4d_fp8's bit tricks), after the default")
    parser.add_argument("--ms", nargs="+", type=int, help="activation rows M (default 1 2 4 8; --quick: 1 8)")
    parser.add_argument("--skip-fused", action="store_true", help="the GEMVs alone: not the bf16 fused rows after them")
    args = parser.parse_args()
    device, stream, registry, lib = libr4d_on_card()
    rows = {row.name: row for row in lib.rows}
    DEVICE_ROWS.append(importlib.import_module(f"{rows['r4dchain_gemv_plain_dev'].plugin.module.__name__}.device_rows"))
    on_card, started = Card(device, stream), time.perf_counter()
    timer = Timer(on_card)
    results = {"card": getattr(device, "name", "?"), "target": device.target, "gemv": [], "sweep": [], "fused": []}
    results["copy_Bps"] = copy_ceiling(on_card)
    print(f"card {results['card']} ({device.target}); device-to-device copy {results['copy_Bps'] / 1e9:.0f} GB/s "
          f"(read + write)", flush=True)
    if args.sweep:
        sweep(on_card, registry, rows, timer, results)
        if results.get("best_cut"):  # the timings below use it
            DEVICE_ROWS[0].dk.STREAM = DEVICE_ROWS[0].dk.StreamShape.parse(results["best_cut"])
    # what the row picks (gemv.cu unless R4D_GEMV_STREAM asks for gemv_stream.cu), or both
    kernels = ["stream", "split"] if args.both or args.sweep else ["stream" if DEVICE_ROWS[0].dk.STREAM else "split"]
    formats = args.formats or (("bf16",) if args.quick else ("bf16", "q8_0", "q4_1"))
    ms = args.ms or ((1, 8) if args.quick else (1, 2, 4, 8))
    for fmt in formats:
        for label, n, k in SHAPES if fmt == "bf16" else SHAPES[:-1]:  # the quantised lm heads: slow to make here
            for m in ms:  # gemv.cu where the stream kernel does not serve
                for bits in (False, True) if fmt == "fp8_channel" and args.fp8_bits else (False,):
                    served = len(results["gemv"])
                    bench_gemv(on_card, registry, rows, timer, fmt, label, n, k, [m], results, kernels, fp8_bits=bits)
                    if len(results["gemv"]) == served:
                        bench_gemv(on_card, registry, rows, timer, fmt, label, n, k, [m], results, ["split"], fp8_bits=bits)
    if not args.skip_fused:
        bench_fused(on_card, registry, rows, timer, results)
    registry.close()
    out = os.environ.get("OUT")
    if out:
        Path(out, "device_ops.json").write_text(json.dumps(results, indent=1))
        if results.get("best_cut"):
            Path(out, "best_cut.txt").write_text(results["best_cut"] + "\n")
    at_one = [e["of_4.8TBps"] for e in results["gemv"] if e["M"] == 1 and not e.get("sweep")]
    print(json.dumps({"gemv_m1_min_of_hbm": min(at_one), "gemv_m1_median_of_hbm": statistics.median(at_one),
                      "gemv_m8_min_of_hbm": min((e["of_4.8TBps"] for e in results["gemv"] if e["M"] == 8), default=None),
                      "seconds": time.perf_counter() - started}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
