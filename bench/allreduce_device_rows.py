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
import subprocess
import sys
import time
import traceback
from pathlib import Path

from checkout_shim import ROOT, SHIM_PATH  # noqa: E402,F401  (first: maps the checkout under `radiance.`)

KiB, MiB = 1 << 10, 1 << 20
SIZES = [8 * KiB, 32 * KiB, 128 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 8 * MiB]
FORMS = ("p2p", "host")
KERNELS = ("one_shot", "two_shot")
K, R = 50, 3


def plain_iterations(nbytes):
    return 200 if nbytes <= 1 * MiB else 50


def rank_main(rank, world, run_id, barrier, queue):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    report = {"rank": rank, "times": {}}
    try:
        _measure(rank, world, run_id, barrier, report)
    except Exception as error:  # noqa: BLE001
        report["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    queue.put(report)


def _measure(rank, world, run_id, barrier, report):
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
                device.begin_capture(stream)
                for _ in range(K):
                    launch()
                graph = device.instantiate(device.end_capture(stream))
                barrier_()
                device.launch_graph(graph, stream)      # absorbs the ranks' skew
                start, end = device.event(), device.event()
                device.record(start, stream)
                for _ in range(R):
                    device.launch_graph(graph, stream)
                device.record(end, stream)
                replayed = device.elapsed_ms(start, end) * 1e3 / (K * R)
                report["times"][f"{form} {kernel} {nbytes}"] = {"plain_us": round(plain, 2), "graph_us": round(replayed, 2)}
        report.setdefault("default_kernel", {})[form] = {n: coll.form_for(n) for n in SIZES}
        report.setdefault("timed_out", {})[form] = peers.timed_out(stream)
        barrier_()
        peers.close()
    device.free(x), device.free(y)
    host.close()


def run_tests(out):
    """The card tests, their log streamed to $OUT (it comes back even if the run is cut short)."""
    tests = ["tests/test_device_collectives_rows.py", "tests/test_device_allreduce.py"]
    command = [sys.executable, "-P", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *tests]
    log_path = Path(out or "/tmp", "allreduce_device_rows_tests.log")
    with open(log_path, "w") as log_file:
        try:
            code = subprocess.run(command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, timeout=170).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    log = log_path.read_text()
    print(log[-6000:], flush=True)
    summary = [line for line in log.splitlines() if " passed" in line or " failed" in line or " error" in line]
    return {"returncode": code, "summary": summary[-1] if summary else log[-500:]}


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
        results["tests"] = run_tests(out)
    from radiance.collectives.shm import new_run_id, unlink_run
    context, run_id = mp.get_context("spawn"), new_run_id()
    queue, barrier = context.Queue(), context.Barrier(2)
    t0 = time.perf_counter()
    ranks = [context.Process(target=rank_main, args=(r, 2, run_id, barrier, queue)) for r in range(2)]
    for process in ranks:
        process.start()
    reports = []
    for _ in ranks:
        try:
            reports.append(queue.get(timeout=150))
        except Exception:  # noqa: BLE001  (queue.Empty: a rank hangs; end ours and say so)
            seen = {r["rank"] for r in reports}
            reports += [{"rank": r, "error": f"rank {r} never reported"} for r in range(2) if r not in seen]
            break
    reports.sort(key=lambda r: r["rank"])
    for process in ranks:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    unlink_run(run_id)
    results["seconds"] = round(time.perf_counter() - t0, 1)
    errors = [r["error"] for r in reports if "error" in r]
    if errors:
        results["errors"] = errors
        print("\n".join(errors), flush=True)
    else:
        results["card"] = reports[0]["card"]
        results["timed_out"] = [r["timed_out"] for r in reports]
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
