"""The device layer on a real NVIDIA card (the lent H200s): runs the device tests, then measures.

    PYTHONUNBUFFERED=1 python3 bench/device_smoke.py [--skip-tests] [--quick]

Needs only numpy, cuda-bindings and pytest, which the H200 image carries; radiance need not be
installed: the script maps the checkout's folders under `radiance.` itself (as pyproject's
package-dir does). It prints a summary and writes everything to $OUT/device_smoke.json (and the
test log to $OUT/device_tests.log) when $OUT is set. Measured, all with CUDA events:
  - nvrtc compile of a small source: cold (nvrtc runs), then two disk-cache hits (same and new cache object);
  - copy bandwidth, 1 GiB: host->device and device->host from pinned (registered) and pageable host
    memory, device->device (GB/s of bytes copied; read+write is twice that);
  - launch latency: 100 tiny kernels launched one by one, against one graph replay of the same 100;
  - with 2 or more cards: the device.p2p probe between 2 processes that each see one card (real
    write/read-back through IPC handles), and the copy bandwidth through the peer's IPC mapping.
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from checkout_shim import ROOT, SHIM_PATH  # noqa: E402,F401  (first: maps the checkout under `radiance.`)

import numpy as np  # noqa: E402

from radiance.device import CompileCache, KernelArgs  # noqa: E402

GiB = 1 << 30
SOURCE = r"""
extern "C" __global__ void tiny(float* x, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += 1.0f; }
extern "C" __global__ void fill(unsigned char* x, unsigned long long n, unsigned char v) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) x[i] = v;
}
"""


def open_card(cache_root=None):
    from radiance.device.cuda import CudaDevice
    return CudaDevice(cache=CompileCache(cache_root or tempfile.mkdtemp(prefix="radk")))


def timed(device, work, repeats=5):
    """Median milliseconds of `work()` between two events on the default stream."""
    times = []
    for _ in range(repeats + 1):
        start, end = device.event(), device.event()
        device.record(start)
        work()
        device.record(end)
        times.append(device.elapsed_ms(start, end))
    return statistics.median(times[1:])  # the first is a warm-up


def measure_compile(results):
    cache = tempfile.mkdtemp(prefix="radk")
    device = open_card(cache)
    t0 = time.perf_counter(); device.compile(SOURCE); cold = time.perf_counter() - t0
    t0 = time.perf_counter(); device.compile(SOURCE); warm = time.perf_counter() - t0
    device.cache = CompileCache(cache)
    t0 = time.perf_counter(); code = device.compile(SOURCE); disk = time.perf_counter() - t0
    results["compile_ms"] = {"cold": cold * 1e3, "cache_hit": warm * 1e3, "cache_hit_new_cache_object": disk * 1e3,
                             "compiler": device.compiler_version, "target": device.target, "code_bytes": len(code)}
    results["card"] = {"name": device.name, "target": device.target, "multiprocessors": device.multiprocessors,
                       "budget_bytes": device.budget.limit}
    return device


def measure_copies(device, results, nbytes):
    a, b = device.alloc(nbytes, "copy a"), device.alloc(nbytes, "copy b")
    host = np.ones(nbytes, np.uint8)
    rates = {}
    for label in ("pageable", "pinned"):
        if label == "pinned":
            device.map_host(host)  # registering pins the pages
        rates[f"h2d_{label}"] = nbytes / timed(device, lambda: device.copy_to_device(a, host)) / 1e6
        rates[f"d2h_{label}"] = nbytes / timed(device, lambda: device.copy_to_host(host, a)) / 1e6
    device.unmap_host(host)
    rates["d2d"] = nbytes / timed(device, lambda: device.copy_device(b, a, nbytes)) / 1e6
    results["copy_GBps"] = {k: round(v, 1) for k, v in rates.items()} | {"bytes": nbytes}
    device.free(a), device.free(b)


def measure_launches(device, results, count=100):
    kernel = device.kernel(device.load(device.compile(SOURCE)), "tiny")
    x = device.alloc(256 * 4, "tiny x")
    args = KernelArgs("tiny").pointer(x).i32(256).pack()
    stream = device.stream()
    launch_all = lambda s=None: [device.launch(kernel, 1, 256, args, stream=s) for _ in range(count)]
    plain = timed(device, launch_all)
    device.begin_capture(stream)
    launch_all(stream)
    graph = device.instantiate(device.end_capture(stream))
    replay = timed(device, lambda: device.launch_graph(graph))
    t0 = time.perf_counter(); launch_all(); host = time.perf_counter() - t0
    device.synchronize()
    results["launch_us"] = {"plain_per_kernel": plain * 1e3 / count, "graph_replay_per_kernel": replay * 1e3 / count,
                            "host_issue_per_launch": host * 1e6 / count, "kernels": count}
    device.free(x)


class FileExchange:
    """All-gather through files: round r, rank i writes r.i and reads every r.*."""

    def __init__(self, folder, rank, world):
        self.folder, self.rank, self.world, self.round = Path(folder), rank, world, 0

    def __call__(self, payload):
        (self.folder / f"{self.round}.{self.rank}.tmp").write_bytes(payload)
        (self.folder / f"{self.round}.{self.rank}.tmp").rename(self.folder / f"{self.round}.{self.rank}")
        paths = [self.folder / f"{self.round}.{r}" for r in range(self.world)]
        deadline = time.monotonic() + 60
        while not all(p.exists() for p in paths):
            if time.monotonic() > deadline:
                raise TimeoutError("a peer never reached the exchange")
            time.sleep(0.001)
        self.round += 1
        return [p.read_bytes() for p in paths]


def p2p_rank(rank, card, folder, nbytes, results):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(card)  # before the driver starts: this process sees one card
    from radiance.device.probe import probe_p2p
    device = open_card()
    exchange = FileExchange(folder, rank, 2)
    fact = probe_p2p(device, rank, 2, exchange)
    report = {"rank": rank, "fact": {k: (v if k != "peers" else {str(p): o for p, o in v.items()}) for k, v in fact.items()}}
    mine = device.alloc(nbytes, "bandwidth buffer")
    handles = exchange(device.export_handle(mine))
    peer = device.open_handle(handles[1 - rank], nbytes, "peer buffer")
    exchange(b"opened")
    if rank == 0:  # one direction at a time: rank 0 writes into rank 1's memory, then reads from it
        report["write_GBps"] = nbytes / timed(device, lambda: device.copy_device(peer, mine, nbytes)) / 1e6
        report["read_GBps"] = nbytes / timed(device, lambda: device.copy_device(mine, peer, nbytes)) / 1e6
    device.synchronize()
    exchange(b"done")
    device.close_handle(peer)
    exchange(b"closed")
    device.free(mine)
    results.put(report)


def measure_p2p(results, nbytes):
    from cuda.bindings import driver
    driver.cuInit(0)
    count = driver.cuDeviceGetCount()[1]
    if count < 2:
        results["p2p"] = f"skipped: {count} card(s) visible"
        return
    context, folder = mp.get_context("spawn"), tempfile.mkdtemp(prefix="radp2p")
    queue = context.Queue()
    ranks = [context.Process(target=p2p_rank, args=(r, r, folder, nbytes, queue)) for r in range(2)]
    for process in ranks:
        process.start()
    reports = sorted((queue.get(timeout=150) for _ in ranks), key=lambda r: r["rank"])
    for process in ranks:
        process.join(timeout=30)
    results["p2p"] = {"device.p2p": min(r["fact"]["device.p2p"] for r in reports), "ranks": reports}


def run_tests(out):
    tests = sorted(str(p) for p in (ROOT / "tests").glob("test_device_*.py"))
    command = [sys.executable, "-P", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *tests]
    t0 = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=150)
    log = done.stdout + done.stderr
    if out:
        Path(out, "device_tests.log").write_text(log)
    tail = [line for line in log.splitlines() if line.strip()][-12:]
    return {"exit_code": done.returncode, "seconds": round(time.perf_counter() - t0, 1), "tail": tail}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--quick", action="store_true", help="256 MiB copies instead of 1 GiB")
    options = parser.parse_args()
    out, nbytes = os.environ.get("OUT"), (256 << 20 if options.quick else GiB)
    results = {"python": sys.version.split()[0]}
    if not options.skip_tests:
        results["tests"] = run_tests(out)
        print("\n".join(results["tests"]["tail"]), flush=True)
    steps = [("compile", lambda: results.setdefault("_device", measure_compile(results))),
             ("copies", lambda: measure_copies(results["_device"], results, nbytes)),
             ("launches", lambda: measure_launches(results["_device"], results)),
             ("p2p", lambda: measure_p2p(results, nbytes))]
    for name, step in steps:
        if name in ("copies", "launches") and "_device" not in results:
            results[f"{name}_error"] = "not run: the card did not open (see compile_error)"
            continue
        try:
            step()
        except Exception as error:  # one failed measurement must not hide the others
            results[f"{name}_error"] = f"{type(error).__name__}: {error}"
    results.pop("_device", None)
    print(json.dumps(results, indent=1, default=str))
    if out:
        Path(out, "device_smoke.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if results.get("tests", {}).get("exit_code", 0) == 0 and not any(k.endswith("_error") for k in results) else 1


if __name__ == "__main__":
    sys.exit(main())
