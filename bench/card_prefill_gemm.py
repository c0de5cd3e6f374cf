"""The prefill GEMMs alone on a card (issue 20): libr4d's tensor-core GEMM row (`r4dchain_gemm_tc_bf16_dev`,
on Hopper r4d_narrow_bf16_dev then gemm_wgmma.cu's r4d_wgmma_gemm_bf16) at Llama-3-8B's linear shapes
over one 2048-token step, against torch.matmul in bf16 (cuBLAS) on the same shapes in the same run.

    source bench/card_setup.sh; python3 bench/card_prefill_gemm.py [--tokens 2048] [--lm-head] [--fp8]
    python3 bench/card_prefill_gemm.py --cuts all          # every cut of device_tensor_cores.CUTS, one after another a shape
    python3 bench/card_prefill_gemm.py --cuts 128,128,64,4 128,256,32,5,2   # these cuts (rows,cols,k_bytes,stages[,depth])
    R4D_TC_KERNEL=mma python3 bench/card_prefill_gemm.py   # mma.sync's kernel (gemm_mma.cu) on the same card
    R4D_WG_GROUP=1 python3 bench/card_prefill_gemm.py      # wgmma's tiles in the old order (a wave along a row tile)
    python3 bench/card_prefill_gemm.py --carveout          # the GEMM hinted to the most shared memory first

Shapes (M = --tokens): qkv 4096 -> 6144, o 4096 -> 4096, gate+up 4096 -> 28672, down 14336 -> 4096,
and with --lm-head 4096 -> 128256. radiance: x f32 [M, K] and the weight bf16 [N, K] as the engine
holds them, y f32; the row's launches (the narrowing and the GEMM: the row's whole cost) captured in
a graph as chained launches (bench/device_ops.py's Timer), microseconds a row, the median of 10
replays of --repeats rows; TFLOP/s of 2 M N K. The peer: torch.matmul(x, w.T) of bf16 x and w (bf16
out, cuBLAS), captured and replayed the same way (bench/torch_graph_time.py); its microseconds and
the ratio; the row's first launch alone (x narrowed or quantised) too. With --cuts, each of
gemm_wgmma.cu's cuts in turn (device_tensor_cores.WGMMA_CUT set between launches, each cut its own
compile) against the same torch figure, and a layer's total a cut. Agreement: max |y - ref| / max |ref| against torch's f32 product of the same bf16 values
on the card (TF32 off), and against float64 numpy on 16 sampled rows where torch is missing; the
row's tolerance is device_tensor_cores.TOLERANCE. --fp8: the fp8_channel row too (x quantised per row
to e4m3), against its own tolerance. Runs where radiance is not installed (checkout_shim). Writes
$OUT/card_prefill_gemm.json."""

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from checkout_shim import ROOT  # noqa: F401  (first: maps the checkout under `radiance.`)

sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from device_ops import Timer  # noqa: E402
from torch_graph_time import graph_ms  # noqa: E402
from device_batch_support import fp8_weight  # noqa: E402
from test_device_rows_support import Card, libr4d_on_card  # noqa: E402
from test_libr4d_support import activations, plain_weight  # noqa: E402

SHAPES = [("qkv 4096->6144", 6144, 4096), ("o 4096->4096", 4096, 4096), ("gate+up 4096->28672", 28672, 4096),
          ("down 14336->4096", 4096, 14336)]
LM_HEAD = ("lm head 4096->128256", 128256, 4096)
ROWS = {"bf16": "r4dchain_gemm_tc_bf16_dev", "fp8_channel": "r4dchain_gemm_tc_fp8_dev"}


def tflops(m, n, k, us) -> float:
    return 2 * m * n * k / (us * 1e-6) / 1e12


def bench_radiance(on_card, row, timer, fmt, x, w, weight, repeats) -> tuple:
    m, k = x.shape
    n = w.shape[0]
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    y = np.zeros((m, n), np.float32)
    args = on_card.args(row, [x, None, y], params, {1: weight})
    assert row.info.launch(args) == 0, row.name
    got = on_card.download(args.t[2], y)
    ms = timer.ms([lambda: row.info.launch(args)] * repeats)
    first = first_step_us(on_card, row, args, timer)
    return {"us": ms * 1e3, "tflops": tflops(m, n, k, ms * 1e3), "first_step_us": first}, got


def first_step_us(on_card, row, args, timer) -> float | None:
    """The row's first launch alone where it has two (r4d_narrow_bf16_dev before wgmma's bf16 GEMM,
    r4d_quantize_e4m3_dev before e4m3's): µs, timed as the row is; None for one launch."""
    package = row.plugin.module.__name__
    batch = importlib.import_module(f"{package}.device_batch_rows")
    address = importlib.import_module(f"{package}.device_rows")._address
    dk = importlib.import_module(f"{package}.device_kernels")
    steps = batch.tc_gemm_steps(args, address(args.t[0]), args.t[1], address(args.t[2]))
    if len(steps) < 2:
        return None
    step, stream = steps[0], on_card.stream
    kernel, packed = stream.kernel(dk.source(step.source), step.kernel, step.options), step.args.pack()
    return timer.ms([lambda: stream.launch(kernel, step.grid, step.block, packed, step.shared)] * 4) * 1e3


def torch_product(x, w_bf16):
    """(torch's f32 product of bf16(x) and the bf16 weight, TF32 off, as numpy; the bf16 operands on the card)."""
    import torch
    xt = torch.from_numpy(x).cuda().to(torch.bfloat16)
    wt = torch.from_numpy(w_bf16.view(np.uint16).view(np.int16)).cuda().view(torch.bfloat16)
    torch.backends.cuda.matmul.allow_tf32 = False
    return (xt.float() @ wt.float().T).cpu().numpy(), xt, wt


def bench_torch(xt, wt, repeats) -> dict:
    import torch
    m, k = xt.shape
    n = wt.shape[0]
    ms = graph_ms(lambda: [torch.matmul(xt, wt.T) for _ in range(repeats)], repeats)
    return {"us": ms * 1e3, "tflops": tflops(m, n, k, ms * 1e3)}


def prefer_shared_memory(stream, tc, kind, kernel) -> str:
    """The GEMM entry's carveout hint set to the most shared memory (100 %), before any launch: what
    radiance/device/cuda.py does not do, for a card to compare (--carveout)."""
    try:
        from cuda.bindings import driver
        dk = importlib.import_module(tc.__name__.rsplit(".", 1)[0] + ".device_kernels")
        name = tc.entry(kind, 2048, kernel)
        function = stream.kernel(dk.source(tc.source(kernel)), name, tc.options(name))
        attribute = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        (error,) = driver.cuFuncSetAttribute(function.handle, attribute, 100)
        return f"{name}: carveout 100 %" if int(error) == 0 else f"{name}: cuFuncSetAttribute error {error}"
    except Exception as error:  # said, not fatal
        return f"{type(error).__name__}: {error}"


def blocks_a_multiprocessor(stream, tc, kind, kernel) -> int | str:
    """What the driver allows of the GEMM entry at once on one multiprocessor (cuOccupancy...: the
    cut plans for 2 at 128 x 128, 1 otherwise), or why it cannot say. The entry as the row compiled
    it (the stream's cache), after a launch has opted it in to its dynamic shared memory."""
    try:
        from cuda.bindings import driver
        dk = importlib.import_module(tc.__name__.rsplit(".", 1)[0] + ".device_kernels")
        name = tc.entry(kind, 2048, kernel)
        function = stream.kernel(dk.source(tc.source(kernel)), name, tc.options(name))
        (_, _, _), (threads, _, _) = tc.grid(2048, 4096, 1, kernel, kind)
        error, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(function.handle, threads,
                                                                           tc.shared_bytes(2048, kernel, kind))
        return int(blocks) if int(error) == 0 else f"cuOccupancy error {error}"
    except Exception as error:  # a diagnostic, never fatal
        return f"{type(error).__name__}: {error}"


def sampled_err(got, x, w_values, rows) -> float:
    """max |y - ref| / max |ref| on the sampled rows, ref in float64 of bf16(x) and the weight's values."""
    ref = x[rows].astype(ml_dtypes.bfloat16).astype(np.float64) @ w_values.T
    return float(np.abs(got[rows] - ref).max() / np.abs(ref).max())


def cuts_of(tc, texts, kernels) -> list:
    """The gemm_wgmma.cu cuts to time (--cuts: 'all', or 'rows,cols,k_bytes,stages[,depth]' each); [None] where
    the card runs no wgmma (the cut is then no question) or --cuts is not given (the process's cut)."""
    if "wgmma" not in kernels.values() or not texts:
        return [None]
    if texts == ["all"]:
        return list(tc.CUTS)
    return [tc.WgmmaCut.parse(text) for text in texts]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=4, help="rows a graph replay holds")
    parser.add_argument("--lm-head", action="store_true", help="the 128256-row lm head too")
    parser.add_argument("--fp8", action="store_true", help="the fp8_channel row too")
    parser.add_argument("--carveout", action="store_true",
                        help="hint the GEMM entries to the most shared memory first (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT)")
    parser.add_argument("--cuts", nargs="+", metavar="CUT",
                        help="gemm_wgmma.cu's cuts to compare in this run, each 'rows,cols,k_bytes,stages[,depth]' "
                             "(device_tensor_cores.WgmmaCut), or 'all' (device_tensor_cores.CUTS); default: the "
                             "process's own (R4D_WG_CUT, else CUTS[0])")
    args = parser.parse_args()
    device, stream, registry, lib = libr4d_on_card()
    rows = {row.name: row for row in lib.rows}
    tc = importlib.import_module(f"{rows[ROWS['bf16']].plugin.module.__name__}.device_tensor_cores")
    on_card = Card(device, stream)
    timer = Timer(on_card)
    try:
        import torch
        peer = f"torch {torch.__version__}"
    except ImportError as error:
        torch, peer = None, f"no PyTorch ({error})"
    m = args.tokens
    kernels = {kind: tc.kernel_for("cuda", device.target, kind) for kind in tc.KINDS}
    cuts = cuts_of(tc, args.cuts, kernels)
    own = tc.WGMMA_CUT
    results = {"card": getattr(device, "name", "?"), "target": device.target, "peer": peer, "tokens": m,
               "kernels": kernels, "wgmma_group": tc.WGMMA_GROUP, "tolerance": tc.TOLERANCE, "cases": [],
               "cuts": [str(cut or own) for cut in cuts]}
    print(f"card {results['card']} ({device.target}); M = {m}; kernels {kernels} (wgmma's tiles in groups of "
          f"{tc.WGMMA_GROUP} row tiles; cuts rows,cols,k_bytes,stages[,depth]: {'; '.join(results['cuts'])}); {peer}", flush=True)
    kinds = ["bf16", "e4m3"] if args.fp8 else ["bf16"]
    if args.carveout:
        results["carveout"] = []
        for cut in cuts:
            tc.WGMMA_CUT = cut or own
            results["carveout"] += [prefer_shared_memory(stream, tc, kind, kernels[kind]) for kind in kinds]
        tc.WGMMA_CUT = own
        print(f"  {'; '.join(results['carveout'])}", flush=True)
    total = {"torch": 0.0, **{f"radiance {cut or own}": 0.0 for cut in cuts}}
    for name, n, k in SHAPES + ([LM_HEAD] if args.lm_head else []):
        x = activations(m, k, n + k)
        # fp8_weight's own draw, so that both formats hold the same values before quantising
        w = (np.random.default_rng(n + k).standard_normal((n, k)) * 0.02).astype(np.float32)
        w_bf16 = w.astype(ml_dtypes.bfloat16)
        ref = peer_case = None
        if torch is not None:
            try:
                ref, xt, wt = torch_product(x, w_bf16)
                peer_case = bench_torch(xt, wt, args.repeats)
                del xt, wt
                torch.cuda.empty_cache()
                total["torch"] += peer_case["us"]
                print(f"  {name:21} torch bf16 {peer_case['us']:8.1f} us ({peer_case['tflops']:6.1f} TFLOP/s)", flush=True)
            except Exception as error:  # said, not fatal
                peer_case = {"error": f"{type(error).__name__}: {error}"}
                print(f"  {name:21} torch: {type(error).__name__}: {str(error)[:120]}", flush=True)
        for fmt in ["bf16"] + (["fp8_channel"] if args.fp8 else []):
            kind = "bf16" if fmt == "bf16" else "e4m3"
            weight = plain_weight(w, "bf16") if fmt == "bf16" else fp8_weight(registry, n, k, n + k, "channel")
            for cut in cuts:
                tc.WGMMA_CUT = cut or own
                label = str(tc.wgmma_cut(kind)) if kernels[kind] == "wgmma" else kernels[kind]
                case = {"case": name, "format": fmt, "M": m, "N": n, "K": k, "cut": label,
                        "splits": tc.split(m, n, k, kind, kernels[kind])[0]}
                r, got = bench_radiance(on_card, rows[ROWS[fmt]], timer, fmt, x, w, weight, args.repeats)
                case["radiance"] = r
                samples = np.unique(np.linspace(0, m - 1, 16).astype(int))
                # bf16: against the same bf16 values, held to the row's tolerance; fp8: against the weight
                # before quantising, so the weight's own e4m3 rounding is in it too (said, not held)
                r["err_sampled_f64"] = sampled_err(got, x, (w_bf16 if fmt == "bf16" else w).astype(np.float64), samples)
                first = "" if r["first_step_us"] is None else f", x's narrowing {r['first_step_us']:.1f} us of it"
                line = (f"  {name:21} {fmt:11} {label:14} radiance {r['us']:8.1f} us ({r['tflops']:6.1f} TFLOP/s{first}, "
                        f"{case['splits']} split(s), err {r['err_sampled_f64']:.1e} on 16 rows")
                if fmt == "bf16" and ref is not None:
                    r["err_torch_f32"] = float(np.abs(got - ref).max() / np.abs(ref).max())
                    line += f", {r['err_torch_f32']:.1e} against torch f32)"
                    if "us" in peer_case:
                        case["torch"] = peer_case
                        total[f"radiance {cut or own}"] += r["us"]
                        line += f"; radiance at {peer_case['us'] / r['us']:.2f}x torch's speed"
                else:
                    line += ")" if fmt == "bf16" else " against the unquantised weight)"
                if fmt == "bf16":
                    r["within_tolerance"] = ok = max(r["err_sampled_f64"], r.get("err_torch_f32", 0.0)) <= tc.TOLERANCE["bf16"]
                    line += "" if ok else f"  OUTSIDE THE TOLERANCE {tc.TOLERANCE['bf16']:.0e}"
                print(line, flush=True)
                results["cases"].append(case)
                on_card.close()
    results["blocks_a_multiprocessor"] = {}
    for cut in cuts:
        tc.WGMMA_CUT = cut or own
        for kind in kinds:
            planned = tc.wgmma_cut(kind).blocks if kernels[kind] == "wgmma" else 2
            label = f"{kind} {tc.wgmma_cut(kind)}" if kernels[kind] == "wgmma" else kind
            allowed = blocks_a_multiprocessor(stream, tc, kind, kernels[kind])
            results["blocks_a_multiprocessor"][label] = {"allowed": allowed, "planned": planned}
            print(f"  blocks a multiprocessor the driver allows the GEMM, {label}: {allowed} (planned: {planned})", flush=True)
    tc.WGMMA_CUT = own
    if total["torch"]:
        results["layer_us"] = total
        for cut in cuts:
            us = total[f"radiance {cut or own}"]
            if us:
                print(f"  one layer's bf16 GEMMs, cut {cut or own}: radiance {us:.1f} us, torch {total['torch']:.1f} us; "
                      f"radiance at {total['torch'] / us:.2f}x torch's speed", flush=True)
    registry.close()
    out = os.environ.get("OUT")
    if out:
        Path(out, "card_prefill_gemm.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
