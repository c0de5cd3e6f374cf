"""gemm_tma.cu's grouped and SwiGLU entries against the launches they replace (h20g), one Llama-3-8B
layer's prefill GEMMs on one Hopper card, at M = 512 and 2048 (--tokens):

    source bench/card_setup.sh; python3 bench/card_grouped_gemm.py [--tokens 512 2048] [--repeats 4]

- q, k, v (4096 -> 4096, 1024, 1024): the engine's GEMM row three times (`r4dchain_gemm_tc_bf16_dev`:
  r4d_narrow_bf16_dev of the f32 x, r4d_tma_maps, r4d_tma_gemm_bf16 with the split K it plans), the
  plain entry three times unsplit over one bf16 x (maps + GEMM: the grouped form's sums), and one
  r4d_tma_maps_group + r4d_tma_gemm_bf16_group over the same bf16 x (no norm: the fused row's norm
  writes those rows; device_prefill_rows.group_steps plans it).
- gate, up (4096 -> 14336 each): the row twice then r4d_silu_mul_dev, the plain entry twice unsplit then
  r4d_silu_mul_dev, and one maps_group + r4d_tma_gemm_bf16_swiglu.
- the peer: torch (cuBLAS) bf16 on the same shapes: three matmuls; two matmuls then silu(gate) * up.

Each sequence captured in a graph as chained launches (bench/device_ops.py's Timer; torch's:
bench/torch_graph_time.py), µs a sequence, the median of 10 replays of --repeats sequences; ratios to
the row's and to torch's. Also said: whether the grouped outputs are the unsplit plain launches' bits,
and their max relative difference from the rows' (whose split K sums otherwise). Writes
$OUT/card_grouped_gemm.json."""

import argparse
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
from test_libr4d_support import activations, plain_weight  # noqa: E402
from tma_group_launches import Case, issue, tc  # noqa: E402

ROW = "r4dchain_gemm_tc_bf16_dev"
HIDDEN = 4096
GROUPS = [("q,k,v 4096->4096,1024,1024", (4096, 1024, 1024), False), ("gate,up 4096->14336 x2", (14336, 14336), True)]


def rows_launch(on_card, row, x, weights, ys):
    """The engine's GEMM row a weight (its own plan: narrowing, maps, split K), one RadArgs each."""
    m, k = x.shape
    args = []
    for w, y in zip(weights, ys):
        params = {"M": m, "N": w.shape[0], "K": k, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
        args.append(on_card.args(row, [x, None, y], params, {1: plain_weight(w, "bf16")}))
    return lambda: [row.info.launch(a) for a in args], args


def silu_step(on_card, args, m, n):
    from tma_group_launches import prefill
    return prefill.silu_mul_step(args[0].t[2].data, args[1].t[2].data, m * n, getattr(on_card.stream, "multiprocessors", 1))


def torch_us(torch, x, weights, swiglu, repeats):
    import ml_dtypes
    xt = torch.from_numpy(x).cuda().to(torch.bfloat16)
    ws = [torch.from_numpy(w.astype(ml_dtypes.bfloat16).view(np.int16)).cuda().view(torch.bfloat16) for w in weights]

    def calls():
        out = []
        for _ in range(repeats):
            ys = [torch.matmul(xt, w.T) for w in ws]
            out += [torch.nn.functional.silu(ys[0]) * ys[1]] if swiglu else ys
        return out
    us = graph_ms(calls, repeats) * 1e3
    del xt, ws
    torch.cuda.empty_cache()
    return us


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
    parser.add_argument("--repeats", type=int, default=4, help="sequences a graph replay holds")
    args = parser.parse_args()
    device, stream, registry, lib = libr4d_on_card()
    row = next(r for r in lib.rows if r.name == ROW)
    torch, peer = torch_or_none()
    print(f"card {getattr(device, 'name', '?')} ({device.target}); TMA cut {tc.TMA_CUT}, SwiGLU's {tc.SWIGLU_CUT}; "
          f"grouped forms serve: {tc.groups_serve()}; {peer}", flush=True)
    results = {"card": getattr(device, "name", "?"), "target": device.target, "cut": str(tc.TMA_CUT),
               "swiglu_cut": str(tc.SWIGLU_CUT), "peer": peer, "cases": []}
    for name, rows, swiglu in GROUPS:
        rng = np.random.default_rng(sum(rows))
        weights = [(rng.standard_normal((n, HIDDEN)) * 0.02).astype(np.float32) for n in rows]
        for m in args.tokens:
            on_card = Card(device, stream)
            timer = Timer(on_card)
            x = activations(m, HIDDEN, m)
            ys = [np.zeros((m, n), np.float32) for n in rows]
            by_rows, row_args = rows_launch(on_card, row, x, weights, ys)
            extra = [silu_step(on_card, row_args, m, rows[0])] if swiglu else []
            case = Case(on_card, x, weights, swiglu)
            fused, plain = case.fused_steps(), case.plain_chain()
            sequences = {"rows": lambda: (by_rows(), issue(stream, extra)),
                         "plain unsplit": lambda: issue(stream, plain), "grouped": lambda: issue(stream, fused)}
            got = {label: timer.ms([run] * args.repeats) * 1e3 for label, run in sequences.items()}
            outputs, unsplit = case.read(case.fused), case.read(case.plain)
            by_row = [on_card.download(a.t[2], y) for a, y in zip(row_args, ys)]
            same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(outputs, unsplit))
            apart = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(outputs, by_row))
            if torch is not None:
                try:
                    got["torch"] = torch_us(torch, x, weights, swiglu, args.repeats)
                except Exception as error:  # said, not fatal
                    print(f"  torch: {type(error).__name__}: {str(error)[:120]}", flush=True)
            entry = {"case": name, "M": m, "us": got, "unsplit_bits": same, "rel_diff_rows": apart}
            results["cases"].append(entry)
            figures = "; ".join(f"{label} {us:8.1f} us" for label, us in got.items())
            ratios = f"grouped at {got['rows'] / got['grouped']:.2f}x the rows' speed, {got['plain unsplit'] / got['grouped']:.2f}x unsplit's"
            if "torch" in got:
                ratios += f", {got['torch'] / got['grouped']:.2f}x torch's (rows {got['torch'] / got['rows']:.2f}x)"
            print(f"  {name:27} M {m:<5} {figures}\n  {'':27} {'':7} {ratios}; bits = unsplit plain: {same}, "
                  f"against the rows {apart:.1e}", flush=True)
            on_card.close()
    registry.close()
    out = os.environ.get("OUT")
    if out:
        Path(out, "card_grouped_gemm.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
