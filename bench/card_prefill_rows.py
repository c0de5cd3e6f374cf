"""The elementwise rows of a prefill step, each alone on a card (issue 20): libr4d's rmsnorm, add,
silu_mul and rope rows at the 8B shape over a 2048-token step (f32 activations [2048, 4096], the FFN's
[2048, 14336], q [2048, 32 x 128] and k [2048, 8 x 128]), against PyTorch doing the same in the same run.

    PYTHONUNBUFFERED=1 python3 bench/card_prefill_rows.py [--tokens 2048]

A step's profile cannot show these kernels' own time: each chained kernel is launched while its
predecessor's last wave runs and waits for it at its start (R4D_CHAIN_PROLOGUE), so a profiler's
duration of the add after a GEMM holds the GEMM's tail. Here each row's launch is captured 8 times
over operand copies that a round reads from HBM, not the 60 MB L2 (bench/device_ops.py's Timer and
copies_for), and the median of 10 replays is divided by the launches: microseconds a launch, and the
bytes it must move (read and written once) a second against 4.8 TB/s. The peer: torch in f32 on
the same shapes and as many copies, captured in a CUDA graph (x + y; silu(g) * u, two kernels in
eager torch, the same under torch.compile where it compiles; rms_norm; rope by its formula, eager).
Runs where radiance is not installed (checkout_shim); without PyTorch, radiance's lines alone. Writes
$OUT/card_prefill_rows.json."""

import argparse
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
from test_device_rows_support import Card, libr4d_on_card  # noqa: E402
from test_libr4d_support import make_weight  # noqa: E402

HBM = 4.8e12
HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 8, 128


def cases(m: int, rng) -> dict:
    """{name: (row, operands, params, weights, bytes moved)}"""
    x = lambda n: rng.standard_normal((m, n), dtype=np.float32)  # noqa: E731
    inv_freq = (1.0 / 500000.0 ** (np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM)).astype(np.float32)
    return {
        "rmsnorm [m, 4096]": ("r4dchain_rmsnorm_dev", [x(HIDDEN), None, x(HIDDEN)],
                              {"M": m, "n": HIDDEN, "eps": 1e-5, "dtype": "f32"}, {1: make_weight("f32", 1, HIDDEN, 3)},
                              2 * m * HIDDEN * 4),
        "add [m, 4096]": ("r4dchain_add_dev", [x(HIDDEN), x(HIDDEN), x(HIDDEN)], {"M": m, "n": HIDDEN, "dtype": "f32"},
                          None, 3 * m * HIDDEN * 4),
        "silu_mul [m, 14336]": ("r4dchain_silu_mul_dev", [x(FFN), x(FFN), x(FFN)], {"M": m, "n": FFN, "dtype": "f32"},
                                None, 3 * m * FFN * 4),
        "rope q, k": ("r4dchain_rope_dev", [x(HEADS * HEAD_DIM), x(KV_HEADS * HEAD_DIM), np.arange(m, dtype=np.int32),
                                            inv_freq],
                      {"M": m, "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "interleaved": 0,
                       "dtype": "f32"}, None, 2 * m * (HEADS + KV_HEADS) * HEAD_DIM * 4),
    }


def bench_radiance(on_card, rows, timer, row_name, operands, params, weights, nbytes) -> dict:
    row = rows[row_name]
    copies = copies_for(nbytes)
    launches = []
    for _ in range(copies):
        a = on_card.args(row, operands, params, weights)
        launches.append(lambda a=a: row.info.launch(a))
    ms = timer.ms(launches * max(1, 8 // copies))
    on_card.close()
    return {"us": ms * 1e3, "of_4.8TBps": nbytes / (ms * 1e-3) / HBM, "copies": copies}


def bench_torch(name: str, m: int, nbytes: int) -> dict:
    import torch
    import torch.nn.functional as F

    copies = copies_for(nbytes)
    new = lambda n: torch.randn((m, n), device="cuda", dtype=torch.float32)  # noqa: E731
    if name.startswith("rmsnorm"):
        weight = torch.randn(HIDDEN, device="cuda")
        sets = [(new(HIDDEN),) for _ in range(copies)]
        op = lambda x: F.rms_norm(x, (HIDDEN,), weight, 1e-5)  # noqa: E731
    elif name.startswith("add"):
        sets = [(new(HIDDEN), new(HIDDEN)) for _ in range(copies)]
        op = lambda a, b: a + b  # noqa: E731
    elif name.startswith("silu_mul"):
        sets = [(new(FFN), new(FFN)) for _ in range(copies)]
        op = lambda g, u: F.silu(g) * u  # noqa: E731
    else:
        half = HEAD_DIM // 2
        angles = torch.arange(m, device="cuda")[:, None].float() * (
            1.0 / 500000.0 ** (torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM))[None, :]
        cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]

        def op(q, k):
            out = []
            for t, heads in ((q, HEADS), (k, KV_HEADS)):
                t = t.view(m, heads, HEAD_DIM)
                a, b = t[..., :half], t[..., half:]
                out.append(torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1))
            return out
        sets = [(new(HEADS * HEAD_DIM), new(KV_HEADS * HEAD_DIM)) for _ in range(copies)]
    rounds = max(1, 8 // copies)
    ms = graph_ms(lambda: [op(*s) for s in sets * rounds], copies * rounds)
    return {"us": ms * 1e3, "of_4.8TBps": nbytes / (ms * 1e-3) / HBM}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=2048)
    args = parser.parse_args()
    device, stream, registry, lib = libr4d_on_card()
    rows = {row.name: row for row in lib.rows}
    on_card = Card(device, stream)
    timer, rng = Timer(on_card), np.random.default_rng(0)
    torch, peer = torch_or_none()
    results = {"card": getattr(device, "name", "?"), "target": device.target, "peer": peer, "tokens": args.tokens,
               "cases": []}
    print(f"card {results['card']} ({device.target}); {args.tokens} tokens of the 8B shape, f32; {peer}", flush=True)
    for name, (row_name, operands, params, weights, nbytes) in cases(args.tokens, rng).items():
        case = {"case": name, "row": row_name, "bytes": nbytes}
        case["radiance"] = r = bench_radiance(on_card, rows, timer, row_name, operands, params, weights, nbytes)
        line = f"  {name:22} radiance {r['us']:8.1f} us ({r['of_4.8TBps']:6.1%} of 4.8 TB/s)"
        if torch is not None:
            try:
                case["torch"] = t = bench_torch(name, args.tokens, nbytes)
                line += f"  torch {t['us']:8.1f} us ({t['of_4.8TBps']:6.1%}); radiance at {t['us'] / r['us']:.2f}x torch's speed"
            except Exception as error:
                case["torch"] = {"error": f"{type(error).__name__}: {error}"}
                line += f"  torch: {type(error).__name__}: {str(error)[:120]}"
        print(line, flush=True)
        results["cases"].append(case)
    registry.close()
    out = os.environ.get("OUT")
    if out:
        Path(out, "card_prefill_rows.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
