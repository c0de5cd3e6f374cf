"""What the multi-card all-reduce benches (allreduce_device.py, allreduce_device_rows.py,
allreduce_fused.py) share: their rank processes started and their reports gathered and taken, the card tests
run first with the log streamed to $OUT, and the one way an op is timed: K launches captured in one
CUDA graph, replayed R times, per op (ours through the device layer, NCCL through torch)."""

import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from checkout_shim import ROOT


def rank_main(measure, rank: int, args: tuple, fields: dict, queue) -> None:
    """A rank process's body: measure(rank, *args, report) fills the report ({"rank": rank, **fields});
    what it raises is the report's "error", with its traceback; the report goes to the queue."""
    report = {"rank": rank, **fields}
    try:
        measure(rank, *args, report)
    except Exception as error:  # noqa: BLE001  (the parent prints it; a rank never dies silently)
        report["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    queue.put(report)


def run_ranks(context, measure, world: int, args: tuple, fields: dict, timeout: float) -> tuple[list, float]:
    """`world` processes of `context` (multiprocessing spawn), rank r running measure(r, *args,
    report); (their reports in rank order, seconds). A rank that sends none within `timeout` gets an
    error report; one that does not end is killed."""
    queue = context.Queue()
    started = time.perf_counter()
    ranks = [context.Process(target=rank_main, args=(measure, r, args, fields, queue)) for r in range(world)]
    for process in ranks:
        process.start()
    reports = []
    for _ in ranks:
        try:
            reports.append(queue.get(timeout=timeout))
        except Exception:  # noqa: BLE001  (queue.Empty: a rank hangs; end ours and say so)
            seen = {r["rank"] for r in reports}
            reports += [{"rank": r, "error": f"rank {r} never reported"} for r in range(world) if r not in seen]
            break
    reports.sort(key=lambda r: r["rank"])
    for process in ranks:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    return reports, round(time.perf_counter() - started, 1)


def take_reports(reports: list, results: dict) -> bool:
    """Every rank's error into results["errors"] (printed), if any rank failed; else the card and each
    rank's timed-out flags into results. Whether the ranks' measurements are there to combine."""
    errors = [r["error"] for r in reports if "error" in r]
    if errors:
        results["errors"] = errors
        print("\n".join(errors), flush=True)
        return False
    results["card"] = reports[0]["card"]
    results["timed_out"] = [r["timed_out"] for r in reports]
    return True


def run_tests(out: str | None, tests: list, log_name: str, timeout: float) -> dict:
    """pytest over `tests` (paths from the checkout's root), its log streamed to $OUT/log_name (it
    comes back even if the run is cut short); its exit status and summary line."""
    command = [sys.executable, "-P", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *tests]
    log_path = Path(out or tempfile.gettempdir(), log_name)
    with open(log_path, "w") as log_file:
        try:
            code = subprocess.run(command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    log = log_path.read_text()
    print(log[-6000:], flush=True)
    summary = [line for line in log.splitlines() if " passed" in line or " failed" in line or " error" in line]
    return {"returncode": code, "summary": summary[-1] if summary else log[-500:]}


def graph_us(device, stream, launch, k: int, r: int, barrier, warmup: int = 0) -> float:
    """Microseconds per op: `warmup` plain launches, then k launches captured in one graph on
    `stream` (a raw stream handle), one replay after the barrier (it absorbs the ranks' skew), and r
    replays timed by events."""
    for _ in range(warmup):
        launch()
    device.begin_capture(stream)
    for _ in range(k):
        launch()
    graph = device.instantiate(device.end_capture(stream))
    barrier()
    device.launch_graph(graph, stream)
    start, end = device.event(), device.event()
    device.record(start, stream)
    for _ in range(r):
        device.launch_graph(graph, stream)
    device.record(end, stream)
    device.synchronize(stream)
    return device.elapsed_ms(start, end) * 1e3 / (k * r)


def nccl_graph_us(torch, dist, t, k: int, r: int, barrier) -> float:
    """The same for NCCL's all_reduce of tensor t: warmed on a side stream (as torch.cuda.graph asks),
    k captured in one torch.cuda graph, one replay after the barrier, r replays timed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            dist.all_reduce(t)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(k):
            dist.all_reduce(t)
    torch.cuda.synchronize()
    barrier()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(r):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (k * r)
