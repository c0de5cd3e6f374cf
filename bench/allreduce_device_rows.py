"""The device collective rows' two forms on two cards (the lent nvidia-h200-x2): host-staged against P2P.

    PYTHONUNBUFFERED=1 python3 bench/allreduce_device_rows.py [--tests]

Two processes started with multiprocessing spawn, one card each (CUDA_VISIBLE_DEVICES), each with
HostPeers and a DevicePeers per form (collectives/device_peers.py): p2p (regions on the cards,
opened by IPC handle) and host (regions in POSIX shared memory mapped on both cards, PCIe). f32
all_reduce of 8 KiB to 8 MiB per rank, one-shot and two-shot kernels, timed with CUDA events:
  - plain: back-to-back launches from Python (the device layer's cuLaunchKernel), per op;
  - graph: K all-reduces captured in one CUDA graph, replayed R times, per op.
Per-op times are the slower rank's. No torch, no NCCL (bench/allreduce_device.py compares P2P with
NCCL). --tests first runs tests/test_device_collectives_rows.py and tests/test_device_allreduce.py.
Needs numpy, cuda-bindings and pytest, which the H200 image carries; radiance need not be installed
(the checkout is mapped under `radiance.`). Writes $OUT/allreduce_device_rows.json and, with
--tests, $OUT/allreduce_device_rows_tests.log.
"""

import argparse
import json
import multiprocessing as mp
import os
import sys
from pathlib import Path

from checkout_shim import ROOT, SHIM_PATH  # noqa: E402,F401  (first: maps the checkout under `radiance.`)
from bench_ranks import graph_us, run_ranks, run_tests, take_reports

KiB, MiB = 1 << 10, 1 << 20
SIZES = [8 * KiB, 32 * KiB, 128 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 8 * MiB]
FORMS = ("p2p", "host")
KERNELS = ("one_shot", "two_shot")
K, R = 50, 3


def plain_iterations(nbytes):
    return 200 if nbytes <= 1 * MiB else 50


def measure(rank, world, run_id, barrier, report):
    """One rank, on card `rank`: report["times"] filled."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    import tempfile

    import numpy as np

    from radiance.collectives.device_peers import DevicePeers
    from radiance.collectives.peers import HostPeers
    from radiance.device import CompileCache
    from radiance.device.cuda import CudaDevice

    host = HostPeers.create(run_id, rank, world, 4096)
    barrier.wait(timeout=60)
    host.attach()
    device = CudaDevice(cache=CompileCache(tempfile.mkdtemp(prefix="radk")))
    report["card"] = {"name": device.name, "target": device.target, "sms": device.multiprocessors}
    biggest = max(SIZES)
    x, y = device.alloc(biggest, "x"), device.alloc(biggest + 4096, "y")
    device.copy_to_device(x, np.random.default_rng(rank).standard_normal(biggest // 4, dtype=np.float32))
    stream = device.stream()
    for form in FORMS:
        peers = DevicePeers(device, host, p2p=(form == "p2p"), buffer_bytes=biggest)
        coll = peers.impl

        def barrier_():
            device.synchronize(stream)
            peers.board.exchange(b"")

        for nbytes in SIZES:
            count = nbytes // 4
            for kernel in KERNELS:
                def launch():
                    coll.all_reduce(x.ptr, y.ptr, count, "f32", stream=stream, form=kernel)
                for _ in range(10):
                    launch()
                barrier_()
                iters = plain_iterations(nbytes)
                start, end = device.event(), device.event()
                device.record(start, stream)
                for _ in range(iters):
                    launch()
                device.record(end, stream)
                plain = device.elapsed_ms(start, end) * 1e3 / iters
                replayed = graph_us(device, stream, launch, K, R, barrier_)
                report["times"][f"{form} {kernel} {nbytes}"] = {"plain_us": round(plain, 2), "graph_us": round(replayed, 2)}
        report.setdefault("default_kernel", {})[form] = {n: coll.form_for(n) for n in SIZES}
        report.setdefault("timed_out", {})[form] = peers.timed_out(stream)
        barrier_()
        peers.close()
    device.free(x), device.free(y)
    host.close()


def table(rows):
    lines = [f"{'bytes':>9} {'kernel':>8} | {'p2p plain':>10} {'p2p graph':>10} | {'host plain':>10} {'host graph':>10}  (us/op)"]
    for nbytes in SIZES:
        for kernel in KERNELS:
            cells = [rows[f"{form} {kernel} {nbytes}"][k] for form in FORMS for k in ("plain_us", "graph_us")]
            lines.append(f"{nbytes:>9} {kernel:>8} | {cells[0]:>10.2f} {cells[1]:>10.2f} | {cells[2]:>10.2f} {cells[3]:>10.2f}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", action="store_true", help="run the card tests first")
    options = parser.parse_args()
    out = os.environ.get("OUT")
    results = {"python": sys.version.split()[0], "command": "python3 bench/allreduce_device_rows.py" +
               (" --tests" if options.tests else ""), "K": K, "R": R}
    if options.tests:
        results["tests"] = run_tests(out, ["tests/test_device_collectives_rows.py", "tests/test_device_allreduce.py"],
                                     "allreduce_device_rows_tests.log", 170)
    from radiance.collectives.shm import new_run_id, unlink_run
    context, run_id = mp.get_context("spawn"), new_run_id()
    reports, results["seconds"] = run_ranks(context, measure, 2, (2, run_id, context.Barrier(2)), {"times": {}}, 150)
    unlink_run(run_id)
    if take_reports(reports, results):
        results["default_kernel"] = reports[0]["default_kernel"]
        keys = reports[0]["times"].keys()
        results["rows"] = {key: {k: max(r["times"][key][k] for r in reports) for k in ("plain_us", "graph_us")}
                           for key in keys}
        results["per_rank"] = [r["times"] for r in reports]
        print(table(results["rows"]), flush=True)
    if out:
        Path(out, "allreduce_device_rows.json").write_text(json.dumps(results, indent=1))
    print(json.dumps({k: v for k, v in results.items() if k not in ("rows", "per_rank")}, indent=1), flush=True)


if __name__ == "__main__":
    main()
