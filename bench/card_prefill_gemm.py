"""The prefill GEMMs alone on a card (issue 20): libr4d's tensor-core GEMM row (`r4dchain_gemm_tc_bf16_dev`,
on Hopper r4d_narrow_bf16_dev then gemm_wgmma.cu's r4d_wgmma_gemm_bf16) at Llama-3-8B's linear shapes
over one 2048-token step, against torch.matmul in bf16 (cuBLAS) on the same shapes in the same run.

    source bench/card_setup.sh; python3 bench/card_prefill_gemm.py [--tokens 2048] [--lm-head] [--fp8]
    python3 bench/card_prefill_gemm.py --cuts all          # every cut of device_tensor_cores.CUTS, one after another a shape
    python3 bench/card_prefill_gemm.py --cuts 128,128,64,4 128,256,32,5,2   # these cuts (rows,cols,k_bytes,stages[,depth])
    R4D_TC_KERNEL=mma python3 bench/card_prefill_gemm.py   # mma.sync's kernel (gemm_mma.cu) on the same card
    python3 bench/card_prefill_gemm.py --kernels tma wgmma # gemm_tma.cu and gemm_wgmma.cu one after the other a shape
    python3 bench/card_prefill_gemm.py --kernels tma --tma-cuts all   # every cut of device_tensor_cores.TMA_CUTS
    python3 bench/card_prefill_gemm.py --tokens 16 32 64 128 --kernels skinny wgmma tma --skinny-cuts all
        # batched decode's M: gemm_skinny.cu (each cut of device_tensor_cores.SKINNY_CUTS) against the tile kernels
    python3 bench/card_prefill_gemm.py --tokens 8 64 --kernels skinny --gemv   # at M <= 8: the GEMV row against skinny
    R4D_WG_GROUP=1 python3 bench/card_prefill_gemm.py      # wgmma's tiles in the old order (a wave along a row tile)
    python3 bench/card_prefill_gemm.py --carveout          # the GEMM hinted to the most shared memory first
    python3 bench/card_prefill_gemm.py --tokens 16 32 64 --lm-head --streamed 1 8,2,64,3   # batched decode's M:
        # the tile GEMM against gemm_streamed.cu's cuts ('1' its default; warps,tiles,stage,pipe[,chunks]), weight TB/s

Shapes (M = each of --tokens, one after another a shape): qkv 4096 -> 6144, o 4096 -> 4096, gate+up 4096 -> 28672, down 14336 -> 4096,
with --streamed or --kernels skinny k/v 4096 -> 1024, and with --lm-head 4096 -> 128256. radiance: x f32 [M, K] and the weight bf16 [N, K] as the engine
holds them, y f32; the row's launches (the narrowing and the GEMM: the row's whole cost) captured in
a graph as chained launches (bench/device_ops.py's Timer), microseconds a row, the median of 10
replays of --repeats rows; TFLOP/s of 2 M N K. The peer: torch.matmul(x, w.T) of bf16 x and w (bf16
out, cuBLAS), captured and replayed the same way (bench/torch_graph_time.py); its microseconds and
the ratio; the row's first launch alone (x narrowed or quantised) too. With --cuts, each of
gemm_wgmma.cu's cuts in turn (device_tensor_cores.WGMMA_CUT set between launches, each cut its own
compile) against the same torch figure, and a layer's total a cut. With --kernels, each tile kernel
named in turn (device_tensor_cores.KERNEL set between launches; tma in each of --tma-cuts, its
launches r4d_tma_maps included; skinny, gemm_skinny.cu, in each of --skinny-cuts). Agreement: max |y - ref| / max |ref| against torch's f32 product of the same bf16 values
on the card (TF32 off), and against float64 numpy on 16 sampled rows where torch is missing; the
row's tolerance is device_tensor_cores.TOLERANCE. --fp8: the fp8_channel row too (x quantised per row
to e4m3), against its own tolerance. --streamed: at M <= 64, the same row again with
device_streamed_gemm.SERVING set to each cut given (the streamed GEMM of batched decode, x rounded to bf16
for both formats); --gemv: at M <= 8 (the GEMV band) the decode GEMV row (`r4dchain_gemv_plain_dev`) and
the --kernels named skinny alone (the tile kernels and the streamed GEMM are for M above the band);
every figure at M <= 128 also as TB/s of the weight's bytes (the copy rate of an
H200 is ~4.25), with the streamed GEMM's speed against the tile GEMM's and torch's. Runs where radiance is not installed (checkout_shim). Writes
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
from torch_graph_time import graph_ms, torch_or_none  # noqa: E402
from device_batch_support import fp8_weight  # noqa: E402
from test_device_rows_support import Card, libr4d_on_card  # noqa: E402
from test_libr4d_support import activations, plain_weight  # noqa: E402

SHAPES = [("qkv 4096->6144", 6144, 4096), ("o 4096->4096", 4096, 4096), ("gate+up 4096->28672", 28672, 4096),
          ("down 14336->4096", 4096, 14336)]
LM_HEAD = ("lm head 4096->128256", 128256, 4096)
# with --streamed or --kernels skinny: k's and v's own shape too (the batch path runs q, k and v as three
# GEMMs), whose 4 row blocks of the streamed GEMM fill half the card even at 16 splits, and where
# gemm_wgmma.cu took 66-92 us at batch 64 against q's 22 (bench/results/raw_2026-12-03h/call1_batches.txt)
NARROW = ("k/v 4096->1024", 1024, 4096)
ROWS = {"bf16": "r4dchain_gemm_tc_bf16_dev", "fp8_channel": "r4dchain_gemm_tc_fp8_dev"}
GEMV_ROW = "r4dchain_gemv_plain_dev"  # --gemv: bf16's decode GEMV (M <= 8)


def tflops(m, n, k, us) -> float:
    return 2 * m * n * k / (us * 1e-6) / 1e12


def weight_tbs(n, k, fmt, us) -> float:
    """The weight's bytes a microsecond, in TB/s (bf16 2 bytes a value, e4m3 1)."""
    return n * k * (2 if fmt == "bf16" else 1) / (us * 1e-6) / 1e12


def bench_radiance(on_card, row, timer, fmt, x, w, weight, repeats, first_step=True) -> tuple:
    m, k = x.shape
    n = w.shape[0]
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    y = np.zeros((m, n), np.float32)
    args = on_card.args(row, [x, None, y], params, {1: weight})
    assert row.info.launch(args) == 0, row.name
    got = on_card.download(args.t[2], y)
    ms = timer.ms([lambda: row.info.launch(args)] * repeats)
    first = first_step_us(on_card, row, args, timer) if first_step else None
    return {"us": ms * 1e3, "tflops": tflops(m, n, k, ms * 1e3), "first_step_us": first}, got


def first_step_us(on_card, row, args, timer) -> float | None:
    """The row's first launch alone where it has two (r4d_narrow_bf16_dev before wgmma's bf16 GEMM,
    r4d_quantize_e4m3_dev before e4m3's; the streamed GEMM before r4d_streamed_reduce where K is
    split): µs, timed as the row is; None for one launch."""
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


def blocks_a_multiprocessor(stream, tc, kind, kernel, m=2048) -> int | str:
    """What the driver allows of the GEMM entry at once on one multiprocessor (cuOccupancy...: the
    cut plans for 2 at 128 x 128, 1 otherwise), or why it cannot say. The entry as the row compiled
    it (the stream's cache), after a launch has opted it in to its dynamic shared memory."""
    try:
        from cuda.bindings import driver
        dk = importlib.import_module(tc.__name__.rsplit(".", 1)[0] + ".device_kernels")
        name = tc.entry(kind, m, kernel)
        function = stream.kernel(dk.source(tc.source(kernel)), name, tc.options(name, m))
        (_, _, _), (threads, _, _) = tc.grid(m, 4096, 1, kernel, kind)
        error, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(function.handle, threads,
                                                                           tc.shared_bytes(m, kernel, kind))
        return int(blocks) if int(error) == 0 else f"cuOccupancy error {error}"
    except Exception as error:  # a diagnostic, never fatal
        return f"{type(error).__name__}: {error}"


def sampled_err(got, x, w_values, rows) -> float:
    """max |y - ref| / max |ref| on the sampled rows, ref in float64 of bf16(x) and the weight's values
    (float64, converted once a shape: the lm head's are 4 GB so)."""
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
    parser.add_argument("--tokens", type=int, nargs="+", default=[2048], help="M, one or several")
    parser.add_argument("--repeats", type=int, default=4, help="rows a graph replay holds")
    parser.add_argument("--lm-head", action="store_true", help="the 128256-row lm head too")
    parser.add_argument("--fp8", action="store_true", help="the fp8_channel row too")
    parser.add_argument("--carveout", action="store_true",
                        help="hint the GEMM entries to the most shared memory first (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT)")
    parser.add_argument("--cuts", nargs="+", metavar="CUT",
                        help="gemm_wgmma.cu's cuts to compare in this run, each 'rows,cols,k_bytes,stages[,depth]' "
                             "(device_tensor_cores.WgmmaCut), or 'all' (device_tensor_cores.CUTS); default: the "
                             "process's own (R4D_WG_CUT, else CUTS[0])")
    parser.add_argument("--kernels", nargs="+", choices=["skinny", "wgmma", "tma", "mma", "simt"],
                        help="the tile kernels to time one after another (device_tensor_cores.KERNEL); default: the card's")
    parser.add_argument("--tma-cuts", nargs="+", metavar="CUT",
                        help="gemm_tma.cu's cuts with --kernels tma, each 'cols,k_bytes,stages' or 'all' "
                             "(device_tensor_cores.TMA_CUTS); default: the process's (R4D_TMA_CUT, else TMA_CUTS[0])")
    parser.add_argument("--skinny-cuts", nargs="+", metavar="CUT",
                        help="gemm_skinny.cu's cuts with --kernels skinny, each 'warpgroups,k_bytes' or 'all' "
                             "(device_tensor_cores.SKINNY_CUTS); default: the process's (R4D_SKINNY_CUT, else SKINNY_CUTS[0])")
    parser.add_argument("--gemv", action="store_true",
                        help="at M <= 8, the decode GEMV row against the skinny kernel (the other kernels skipped there)")
    parser.add_argument("--streamed", nargs="+", metavar="CUT",
                        help="at M <= 64, gemm_streamed.cu's cuts to time too, each '1' (the default) or "
                             "'warps,tiles,stage,pipe[,chunks]' (device_streamed_gemm.StreamedCut)")
    args = parser.parse_args()
    device, stream, registry, lib = libr4d_on_card()
    rows = {row.name: row for row in lib.rows}
    tc = importlib.import_module(f"{rows[ROWS['bf16']].plugin.module.__name__}.device_tensor_cores")
    sg = importlib.import_module(f"{rows[ROWS['bf16']].plugin.module.__name__}.device_streamed_gemm")
    streamed = [sg.StreamedCut.parse(text) for text in args.streamed or []]
    own_serving = sg.SERVING
    on_card = Card(device, stream)
    timer = Timer(on_card)
    torch, peer = torch_or_none()
    kernels = {kind: tc.kernel_for("cuda", device.target, kind) for kind in tc.KINDS}
    cuts = cuts_of(tc, args.cuts, {**kernels, "named": "wgmma" if "wgmma" in (args.kernels or []) else None})
    own, own_kernel, own_tma, own_skinny = tc.WGMMA_CUT, tc.KERNEL, tc.TMA_CUT, tc.SKINNY_CUT
    tma_cuts = (list(tc.TMA_CUTS) if args.tma_cuts == ["all"] else [tc.TmaCut.parse(text) for text in args.tma_cuts or []]
                ) or [own_tma]
    skinny_cuts = (list(tc.SKINNY_CUTS) if args.skinny_cuts == ["all"]
                   else [tc.SkinnyCut.parse(text) for text in args.skinny_cuts or []]) or [own_skinny]
    results = {"card": getattr(device, "name", "?"), "target": device.target, "peer": peer, "tokens": args.tokens,
               "kernels": kernels, "wgmma_group": tc.WGMMA_GROUP, "tolerance": tc.TOLERANCE, "cases": [],
               "cuts": [str(cut or own) for cut in cuts], "streamed_cuts": [str(cut) for cut in streamed],
               "named_kernels": args.kernels, "tma_cuts": [str(cut) for cut in tma_cuts],
               "skinny_cuts": [str(cut) for cut in skinny_cuts], "skinny_below": tc.SKINNY_BELOW}
    print(f"card {results['card']} ({device.target}); M = {args.tokens}; streamed cuts {results['streamed_cuts']}; kernels {kernels} (wgmma's tiles in groups of "
          f"{tc.WGMMA_GROUP} row tiles; cuts rows,cols,k_bytes,stages[,depth]: {'; '.join(results['cuts'])}); {peer}", flush=True)
    kinds = ["bf16", "e4m3"] if args.fp8 else ["bf16"]
    if args.carveout:
        results["carveout"] = []
        for cut in cuts:
            tc.WGMMA_CUT = cut or own
            results["carveout"] += [prefer_shared_memory(stream, tc, kind, kernels[kind]) for kind in kinds]
        tc.WGMMA_CUT = own
        print(f"  {'; '.join(results['carveout'])}", flush=True)
    total = {}  # (M, what) -> microseconds of a layer's GEMMs
    narrow = streamed or "skinny" in (args.kernels or [])  # batched decode's k and v, each its own GEMM
    for name, n, k in SHAPES + ([NARROW] if narrow else []) + ([LM_HEAD] if args.lm_head else []):
        # fp8_weight's own draw, so that both formats hold the same values before quantising
        w = (np.random.default_rng(n + k).standard_normal((n, k)) * 0.02).astype(np.float32)
        w_bf16 = w.astype(ml_dtypes.bfloat16)
        weights = {"bf16": plain_weight(w, "bf16")}
        values = {"bf16": w_bf16.astype(np.float64)}
        if args.fp8:
            weights["fp8_channel"] = fp8_weight(registry, n, k, n + k, "channel")
            values["fp8_channel"] = w.astype(np.float64)
        for m in args.tokens:
            x = activations(m, k, n + k)
            ref = peer_case = None
            layer = name not in (LM_HEAD[0], NARROW[0])  # a layer: qkv, o, gate+up, down
            if torch is not None:
                try:
                    ref, xt, wt = torch_product(x, w_bf16)
                    peer_case = bench_torch(xt, wt, args.repeats)
                    del xt, wt
                    torch.cuda.empty_cache()
                    if layer:
                        total[(m, "torch")] = total.get((m, "torch"), 0.0) + peer_case["us"]
                    rate = f", {weight_tbs(n, k, 'bf16', peer_case['us']):.2f} TB/s" if m <= 128 else ""
                    print(f"  {name:21} M {m:<5} torch bf16 {peer_case['us']:8.1f} us ({peer_case['tflops']:6.1f} TFLOP/s{rate})",
                          flush=True)
                except Exception as error:  # said, not fatal
                    peer_case = {"error": f"{type(error).__name__}: {error}"}
                    print(f"  {name:21} M {m:<5} torch: {type(error).__name__}: {str(error)[:120]}", flush=True)
            for fmt, weight in weights.items():
                kind = "bf16" if fmt == "bf16" else "e4m3"
                named = args.kernels or [None]  # None: the card's own kernel (R4D_TC_KERNEL or kernel_for)
                variants = [("tile", kernel, cut) for kernel in named
                            for cut in (tma_cuts if kernel == "tma" else skinny_cuts if kernel == "skinny"
                                        else cuts if kernel in (None, "wgmma") else [None])]
                variants += [("streamed", None, cut) for cut in (streamed if m <= sg.MAX_M else [])]
                if args.gemv and m <= tc.GEMV_MAX_M and fmt == "bf16":
                    variants = [("gemv", None, None)] + [v for v in variants if v[1] == "skinny"]
                tile_us = gemv_us = None
                for path, kernel, cut in variants:
                    tc.KERNEL = kernel or own_kernel
                    running = tc.kernel_for("cuda", device.target, kind, m)
                    if path == "tile":
                        tc.WGMMA_CUT, tc.TMA_CUT, tc.SKINNY_CUT, sg.SERVING = own, own_tma, own_skinny, None
                        if running == "tma":
                            tc.TMA_CUT = cut or own_tma
                            label = f"tma {tc.TMA_CUT}"
                        elif running == "skinny":
                            tc.SKINNY_CUT = cut if kernel == "skinny" and cut else own_skinny
                            label = f"skinny {tc.SKINNY_CUT}"
                        else:
                            tc.WGMMA_CUT = cut or own
                            label = str(tc.wgmma_cut(kind)) if running == "wgmma" else running
                            label = f"wgmma {label}" if args.kernels and running == "wgmma" else label
                        label = f"tile {label}" if streamed and m <= sg.MAX_M else label
                        splits = tc.split(m, n, k, kind, running)[0]
                    elif path == "gemv":
                        label, splits = "gemv", 1
                    else:
                        tc.WGMMA_CUT, sg.SERVING = own, sg.Serving(cut)  # every M of the bench, 64 too
                        label, splits = f"streamed {cut}", sg.split(m, n, k, kind, cut)[0]
                    case = {"case": name, "format": fmt, "M": m, "N": n, "K": k, "path": path, "cut": label,
                            "splits": splits}
                    row = rows[GEMV_ROW if path == "gemv" else ROWS[fmt]]
                    r, got = bench_radiance(on_card, row, timer, fmt, x, w, weight, args.repeats, path != "gemv")
                    case["radiance"] = r
                    r["weight_tbs"] = weight_tbs(n, k, fmt, r["us"])
                    samples = np.unique(np.linspace(0, m - 1, 16).astype(int))
                    # bf16: against the same bf16 values, held to the row's tolerance; fp8: against the weight
                    # before quantising, so the weight's own e4m3 rounding is in it too (said, not held)
                    r["err_sampled_f64"] = sampled_err(got, x, values[fmt], samples)
                    first = "" if r["first_step_us"] is None else (
                        f", x's narrowing {r['first_step_us']:.1f} us of it" if path == "tile"
                        else f", {r['first_step_us']:.1f} us before r4d_streamed_reduce")
                    rate = f", {r['weight_tbs']:.2f} TB/s" if m <= 128 else ""
                    line = (f"  {name:21} M {m:<5} {fmt:11} {label:22} radiance {r['us']:8.1f} us ({r['tflops']:6.1f} TFLOP/s"
                            f"{rate}{first}, {splits} split(s), err {r['err_sampled_f64']:.1e} on 16 rows")
                    if fmt == "bf16" and ref is not None:
                        r["err_torch_f32"] = float(np.abs(got - ref).max() / np.abs(ref).max())
                        line += f", {r['err_torch_f32']:.1e} against torch f32)"
                        if "us" in peer_case:
                            case["torch"] = peer_case
                            if layer:
                                key = (m, f"radiance {label}")
                                total[key] = total.get(key, 0.0) + r["us"]
                            line += f"; at {peer_case['us'] / r['us']:.2f}x torch's speed"
                    else:
                        line += ")" if fmt == "bf16" else " against the unquantised weight)"
                    if path == "gemv":
                        gemv_us = r["us"]
                        line += "; the GEMV band's row"
                    elif path == "tile" and gemv_us:
                        case["speed_against_gemv"] = gemv_us / r["us"]
                        line += f"; {case['speed_against_gemv']:.2f}x the GEMV's"
                    elif path == "tile" and tile_us is None:
                        tile_us = r["us"]
                    elif path == "streamed" and tile_us:
                        case["speed_against_tile"] = tile_us / r["us"]
                        line += f"; {case['speed_against_tile']:.2f}x the tile GEMM's"
                    if fmt == "bf16":
                        r["within_tolerance"] = ok = max(r["err_sampled_f64"], r.get("err_torch_f32", 0.0)) <= tc.TOLERANCE["bf16"]
                        line += "" if ok else f"  OUTSIDE THE TOLERANCE {tc.TOLERANCE['bf16']:.0e}"
                    print(line, flush=True)
                    results["cases"].append(case)
                    on_card.close()
    tc.WGMMA_CUT, tc.TMA_CUT, tc.SKINNY_CUT, tc.KERNEL, sg.SERVING = own, own_tma, own_skinny, own_kernel, own_serving
    results["blocks_a_multiprocessor"] = {}
    if "skinny" in (args.kernels or []):
        for cut in skinny_cuts:
            tc.SKINNY_CUT = cut
            for m in sorted({tc.skinny_variant(m) for m in args.tokens}):
                label = f"skinny {cut} SK_MX {m}"
                allowed = blocks_a_multiprocessor(stream, tc, "bf16", "skinny", m)
                results["blocks_a_multiprocessor"][label] = {"allowed": allowed, "planned": cut.blocks(m)}
                print(f"  blocks a multiprocessor the driver allows the GEMM, {label}: {allowed} (planned: {cut.blocks(m)})",
                      flush=True)
        tc.SKINNY_CUT = own_skinny
    for cut in cuts:
        tc.WGMMA_CUT = cut or own
        for kind in kinds:
            planned = tc.wgmma_cut(kind).blocks if kernels[kind] == "wgmma" else 2
            label = f"{kind} {tc.wgmma_cut(kind)}" if kernels[kind] == "wgmma" else kind
            allowed = blocks_a_multiprocessor(stream, tc, kind, kernels[kind])
            results["blocks_a_multiprocessor"][label] = {"allowed": allowed, "planned": planned}
            print(f"  blocks a multiprocessor the driver allows the GEMM, {label}: {allowed} (planned: {planned})", flush=True)
    tc.WGMMA_CUT = own
    results["layer_us"] = {f"M {m} {what}": us for (m, what), us in total.items()}
    for (m, what), us in total.items():
        peer_us = total.get((m, "torch"))
        if what != "torch" and peer_us:
            print(f"  one layer's bf16 GEMMs at M {m}, {what}: {us:.1f} us, torch {peer_us:.1f} us; "
                  f"at {peer_us / us:.2f}x torch's speed", flush=True)
    registry.close()
    out = os.environ.get("OUT")
    if out:
        Path(out, "card_prefill_gemm.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
