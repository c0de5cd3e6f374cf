"""Device P2P all-reduce against NCCL on N cards (two on the lent nvidia-h200-x2), in the same run.

    PYTHONUNBUFFERED=1 python3 bench/allreduce_device.py [--tests] [--quick] [--ranks N]

`--ranks N` (default 2) processes started with multiprocessing spawn, one card each (CUDA_VISIBLE_DEVICES), which
exchange IPC handles through torch.distributed's FileStore and also form an NCCL process group
(NVLink multicast stays off: NCCL_NVLS_ENABLE=0). bf16 messages of 8 KB to 1 GiB; for each size:
  - ours, plain: back-to-back launches from Python (the device layer's cuLaunchKernel), per op;
  - ours, graph: K all-reduces captured in one CUDA graph, replayed R times, per op; both forms
    (one-shot, two-shot) and the default one (collectives/device_p2p.py, one_shot_max_bytes);
  - NCCL through torch.distributed, plain and captured in a torch.cuda graph the same way;
  - whether our result equals NCCL's bit for bit (at 2 ranks a + b is the rank-order sum).
Per-op times are the slower rank's (CUDA events on each rank). Bus bandwidth = 2 (N-1)/N * bytes / time.
--tests first runs tests/test_device_allreduce.py (host and card tests). Needs numpy, cuda-bindings,
torch and pytest, which the H200 image carries; radiance need not be installed (the checkout is
mapped under `radiance.` as bench/device_smoke.py does). Writes $OUT/allreduce_device.json.
"""

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
from pathlib import Path

from checkout_shim import ROOT, SHIM_PATH  # noqa: E402,F401  (first: maps the checkout under `radiance.`)
from bench_ranks import graph_us, nccl_graph_us, run_ranks, run_tests, take_reports
os.environ["NCCL_NVLS_ENABLE"] = "0"                 # never NVLink multicast (KINDS.md)
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
LATENCY_SIZES = [8 * KiB << i for i in range(11)]             # 8 KiB .. 8 MiB
BANDWIDTH_SIZES = [16 * MiB, 64 * MiB, 256 * MiB, 1 * GiB]


def plan(size):
    """(plain iterations, graph ops K, graph replays R)."""
    if size <= 8 * MiB:
        return 300, 100, 5
    if size <= 64 * MiB:
        return 20, 10, 3
    return 6, 3, 2


def measure(rank, world, store_path, sizes, report):
    """One rank, on card `rank`: report["sizes"] filled."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    from radiance.device import CompileCache
    from radiance.device.cuda import CudaDevice
    from radiance.collectives.device_p2p import DeviceP2P
    device = CudaDevice(cache=CompileCache(tempfile.mkdtemp(prefix="radk")))
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(0)
    store = dist.FileStore(store_path, world)
    dist.init_process_group("nccl", store=store, rank=rank, world_size=world, device_id=torch.device("cuda", 0))
    rounds = [0]

    def exchange(payload):
        r = rounds[0]
        rounds[0] += 1
        store.set(f"p2p.{r}.{rank}", payload)
        return [bytes(store.get(f"p2p.{r}.{p}")) for p in range(world)]

    small = torch.zeros(1, device="cuda")

    def barrier():
        device.synchronize(stream)
        torch.cuda.synchronize()
        dist.all_reduce(small)
        torch.cuda.synchronize()

    biggest = max(sizes)
    coll = DeviceP2P(device, rank, world, biggest, exchange)
    report["card"] = {"name": device.name, "target": device.target, "sms": device.multiprocessors,
                      "torch": torch.__version__, "nccl": str(torch.cuda.nccl.version()),
                      "max_blocks": coll.max_blocks}
    x = torch.randn(biggest // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty(biggest // 2 + 4096, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    stream = device.stream()
    xp, yp = x.data_ptr(), y.data_ptr()

    def ours_plain(count, iters, form):
        for _ in range(5):
            coll.all_reduce(xp, yp, count, "bf16", stream=stream, form=form)
        barrier()
        for _ in range(10):
            coll.all_reduce(xp, yp, count, "bf16", stream=stream, form=form)
        start, end = device.event(), device.event()
        device.record(start, stream)
        for _ in range(iters):
            coll.all_reduce(xp, yp, count, "bf16", stream=stream, form=form)
        device.record(end, stream)
        return device.elapsed_ms(start, end) * 1e3 / iters

    def ours_graph(count, k, r, form):
        return graph_us(device, stream, lambda: coll.all_reduce(xp, yp, count, "bf16", stream=stream, form=form),
                        k, r, barrier)

    def nccl_plain(t, iters):
        for _ in range(5):
            dist.all_reduce(t)
        barrier()
        for _ in range(10):
            dist.all_reduce(t)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(t)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e3 / iters

    def nccl_graph(t, k, r):
        return nccl_graph_us(torch, dist, t, k, r, barrier)

    for size in sizes:
        count = size // 2
        iters, k, r = plan(size)
        row = {"bytes": size, "default_form": coll.form_for(size)}
        # agreement with NCCL, before any timing touches t
        t = x[:count].clone()
        barrier()
        dist.all_reduce(t)
        torch.cuda.synchronize()
        coll.all_reduce(xp, yp, count, "bf16", stream=stream)
        device.synchronize(stream)
        row["equals_nccl"] = bool(torch.equal(y[:count], t))
        for label, step in (("ours_plain_us", lambda: ours_plain(count, iters, None)),
                            ("one_shot_graph_us", lambda: ours_graph(count, k, r, "one_shot")),
                            ("two_shot_graph_us", lambda: ours_graph(count, k, r, "two_shot")),
                            ("nccl_plain_us", lambda: nccl_plain(t, iters)),
                            ("nccl_graph_us", lambda: nccl_graph(t, k, r))):
            try:
                row[label] = step()
            except Exception as error:  # noqa: BLE001  (one failed measurement must not hide the rest)
                row[label.replace("_us", "_error")] = f"{type(error).__name__}: {error}"
                barrier()
        report["sizes"][size] = row
        if rank == 0:
            print(f"  {size:>11} B done", flush=True)
    barrier()
    report["timed_out"] = coll.timed_out()
    coll.close()
    dist.destroy_process_group()


def combine(reports, world):
    """Per size: the slower rank's per-op time, bus bandwidth, the ours/NCCL ratio."""
    rows = []
    for size in reports[0]["sizes"]:
        per_rank = [r["sizes"][size] for r in reports]
        row = {"bytes": int(size), "default_form": per_rank[0]["default_form"],
               "equals_nccl": all(p["equals_nccl"] for p in per_rank)}
        for key in ("ours_plain_us", "one_shot_graph_us", "two_shot_graph_us", "nccl_plain_us", "nccl_graph_us"):
            values = [p.get(key) for p in per_rank]
            if None in values:
                row[key.replace("_us", "_error")] = next(p.get(key.replace("_us", "_error")) for p in per_rank)
                continue
            row[key] = round(max(values), 2)
            row[key.replace("_us", "_busbw_GBps")] = round(2 * (world - 1) / world * int(size) / (max(values) * 1e-6) / 1e9, 1)
        if "one_shot_graph_us" in row and "two_shot_graph_us" in row:
            row["ours_graph_us"] = row[f"{row['default_form']}_graph_us"]
            row["ours_graph_busbw_GBps"] = row[f"{row['default_form']}_graph_busbw_GBps"]
        rows.append(row)
    return rows


def table(rows):
    head = (f"{'size':>9} | {'form':>8} | {'ours plain':>10} | {'ours graph':>10} | {'1-shot g':>8} | {'2-shot g':>8} | "
            f"{'NCCL plain':>10} | {'NCCL graph':>10} | {'busbw ours g':>12} | {'busbw NCCL':>10} | same")
    lines = [head, "-" * len(head)]
    fmt = lambda v: f"{v:.1f}" if isinstance(v, (int, float)) else "-"
    for row in rows:
        size = row["bytes"]
        name = f"{size // GiB} GiB" if size >= GiB else f"{size // MiB} MiB" if size >= MiB else f"{size // KiB} KiB"
        nccl_bw = max(row.get("nccl_plain_busbw_GBps", 0), row.get("nccl_graph_busbw_GBps", 0))
        lines.append(f"{name:>9} | {row['default_form']:>8} | {fmt(row.get('ours_plain_us')):>10} | "
                     f"{fmt(row.get('ours_graph_us')):>10} | {fmt(row.get('one_shot_graph_us')):>8} | "
                     f"{fmt(row.get('two_shot_graph_us')):>8} | {fmt(row.get('nccl_plain_us')):>10} | "
                     f"{fmt(row.get('nccl_graph_us')):>10} | {fmt(row.get('ours_graph_busbw_GBps')):>12} | "
                     f"{fmt(nccl_bw):>10} | {'yes' if row['equals_nccl'] else 'NO'}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", action="store_true", help="run tests/test_device_allreduce.py first")
    parser.add_argument("--quick", action="store_true", help="latency sizes and 16/64 MiB only")
    parser.add_argument("--ranks", type=int, default=2, help="cards, one process each (2 to 8)")
    options = parser.parse_args()
    if not 2 <= options.ranks <= 8:
        parser.error(f"--ranks {options.ranks}: 2 to 8 cards")
    world = options.ranks
    out = os.environ.get("OUT")
    results = {"python": sys.version.split()[0], "command": "python3 bench/allreduce_device.py" +
               (" --tests" if options.tests else "") + (" --quick" if options.quick else "") +
               f" --ranks {world}"}
    if options.tests:
        results["tests"] = run_tests(out, ["tests/test_device_allreduce.py"], "allreduce_device_tests.log", 200)
    sizes = LATENCY_SIZES + (BANDWIDTH_SIZES[:2] if options.quick else BANDWIDTH_SIZES)
    store = str(Path(tempfile.mkdtemp(prefix="radar")) / "store")
    reports, results["seconds"] = run_ranks(mp.get_context("spawn"), measure, world, (world, store, sizes),
                                            {"sizes": {}}, 200)
    if take_reports(reports, results):
        results["rows"] = combine(reports, world)
        results["per_rank"] = reports
        print(table(results["rows"]), flush=True)
        print(json.dumps(results["card"]), flush=True)
    if out:
        Path(out, "allreduce_device.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if "errors" not in results and results.get("tests", {}).get("returncode", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
