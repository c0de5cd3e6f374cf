"""Latency of a host all-reduce between 2 and 3 rank processes: libr4d's all_reduce_host over the
shared-memory transport of radiance.collectives, against torch.distributed's gloo backend (CPU)
in the same processes, in the same run.

    python bench/allreduce_host.py [--worlds 2 3] [--sizes 8K 64K 1M 8M] [--repeats 3] [--scale 1]
                                   [--spin] [--threshold] [--no-gloo] [--timer-slack-ns N]

--spin also measures the rows with a pure spin in place of rad_wait_word (what the back-off is
worth when ranks outnumber cores); --threshold also measures one-shot and reduce-scatter +
all-gather forced, at every size (how ONE_SHOT_MAX_BYTES was chosen). gloo needs torch, a
benchmark-only extra (`pip install torch==2.13.0`), never a dependency of radiance.

Every figure is the mean time of one all-reduce of f32 zeros over a timed loop (rank 0's clock;
all ranks start it after a barrier), the median of `repeats` loops; ratio = gloo / ours.
"""

import argparse
import importlib.util
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL = ROOT / "plugins" / "kernels" / "libr4d" / "collectives.py"
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B")
    return int(float(text[:-1]) * UNITS[text[-1]]) if text[-1] in UNITS else int(text)


def show_size(nbytes: int) -> str:
    for unit in ("M", "K"):
        if nbytes >= UNITS[unit] and nbytes % UNITS[unit] == 0:
            return f"{nbytes // UNITS[unit]} {unit}B"
    return f"{nbytes} B"


def iterations(mode: str, nbytes: int, world: int, scale: float) -> int:
    """Enough for a stable mean in well under a second per loop."""
    if mode == "gloo":
        base = 300 if nbytes <= 64 << 10 else 60 if nbytes <= 1 << 20 else 10
    elif mode == "spin":
        base = 300 if world <= 2 else 60
        base = base if nbytes <= 64 << 10 else max(base // 5, 10) if nbytes <= 1 << 20 else 8
    else:
        base = 2000 if nbytes <= 16 << 10 else 800 if nbytes <= 64 << 10 else 300 if nbytes <= 256 << 10 \
            else 100 if nbytes <= 1 << 20 else 15
    return max(int(base * scale), 3)


def load_kernel():
    spec = importlib.util.spec_from_file_location("libr4d_collectives", KERNEL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spin_wait(word, value, timeout_ns=0):
    """A pure spin: what the rows must not do (measured here only)."""
    while word[0] < value:
        pass
    return 0


def set_timer_slack(ns: int) -> None:
    """prctl(PR_SET_TIMERSLACK): how late the kernel may wake a sleeping thread (default 50 us)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(29, ctypes.c_ulong(ns), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_TIMERSLACK)")


def rank_main(rank, world, run_id, port, plan, barrier, results, max_bytes, timer_slack_ns):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if timer_slack_ns:
        set_timer_slack(timer_slack_ns)
    import numpy as np

    from radiance.abi import RAD_LINK_ENDED, RAD_OK, RadArgs, rad_tensor
    from radiance.collectives import HostPeers

    kernel = load_kernel()
    peers_owner = HostPeers.create(run_id, rank, world, max_bytes)
    barrier.wait()
    peers = peers_owner.attach()
    gate = np.zeros(1, np.uint64)
    dist = None
    try:
        for key, mode, nbytes, iters in plan:
            count = nbytes // 4
            if mode == "gloo":
                if dist is None:
                    import torch
                    import torch.distributed as dist
                    torch.set_num_threads(1)
                    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                            world_size=world)
                tensor = torch.zeros(count, dtype=torch.float32)

                def once():
                    dist.all_reduce(tensor)
            else:
                x = np.zeros((1, count), np.float32)
                params = {"M": 1, "n": count, "dtype": "f32"}
                if mode == "one-shot":
                    params["one_shot_max_bytes"] = 1 << 62
                elif mode == "two-shot":
                    params["one_shot_max_bytes"] = 0
                args = RadArgs(t=(rad_tensor(x),), params=params, peers=peers, link_gate=gate)
                kernel.wait_word = spin_wait if mode == "spin" else kernel.rad_wait_word
                launch = kernel.all_reduce_host

                def once():
                    gate[0] = 1
                    if launch(args) not in (RAD_OK, RAD_LINK_ENDED):
                        raise RuntimeError(f"all_reduce_host failed at {nbytes} bytes")
            for _ in range(min(10, iters)):
                once()
            barrier.wait()
            start = time.perf_counter()
            for _ in range(iters):
                once()
            seconds = (time.perf_counter() - start) / iters
            if rank == 0:
                results.put((key, seconds))
            barrier.wait()
    finally:
        if dist is not None:
            dist.destroy_process_group()
        peers_owner.close()


def measure(world, modes, sizes, repeats, scale, timer_slack_ns=0):
    """{(mode, nbytes): [seconds per all-reduce, one per repeat]}"""
    from radiance.collectives import new_run_id, unlink_run

    plan = []
    for repeat in range(repeats):
        for nbytes in sizes:
            for mode in modes:
                plan.append(((mode, nbytes), mode, nbytes, iterations(mode, nbytes, world, scale)))
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(world), ctx.Queue()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run_id = new_run_id()
    procs = [ctx.Process(target=rank_main,
                         args=(r, world, run_id, port, plan, barrier, results, max(sizes), timer_slack_ns))
             for r in range(world)]
    try:
        for proc in procs:
            proc.start()
        figures = {}
        for _ in plan:
            while True:
                try:
                    key, seconds = results.get(timeout=1.0)
                    break
                except Exception:  # noqa: BLE001 - queue.Empty: check the ranks are alive
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise SystemExit(f"allreduce_host: a rank died (exit code {dead[0].exitcode})")
            figures.setdefault(key, []).append(seconds)
        for proc in procs:
            proc.join(60)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        unlink_run(run_id)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--sizes", nargs="+", default=["8K", "64K", "1M", "8M"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every loop's iterations")
    parser.add_argument("--spin", action="store_true", help="also measure a pure spin in place of rad_wait_word")
    parser.add_argument("--threshold", action="store_true", help="also measure one-shot and two-shot forced")
    parser.add_argument("--no-gloo", action="store_true")
    parser.add_argument("--timer-slack-ns", type=int, default=0,
                        help="set each rank's timer slack (prctl) first; 0 leaves the default (50 us)")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes]
    modes = ["ours"] + (["spin"] if args.spin else []) + (["one-shot", "two-shot"] if args.threshold else [])
    if not args.no_gloo:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise SystemExit("allreduce_host: gloo needs torch (pip install torch==2.13.0), or pass --no-gloo")
        modes.append("gloo")
    kernel = load_kernel()
    print(f"host all-reduce, f32, {os.cpu_count()} cores; ours = libr4d all_reduce_host "
          f"(one-shot up to {show_size(kernel.ONE_SHOT_MAX_BYTES)}); median of {args.repeats} loops; times in us")
    header = f"{'ranks':>5} {'size':>7} " + " ".join(f"{m:>10}" for m in modes)
    header += "   gloo/ours" if "gloo" in modes else ""
    header += "   spin/ours" if "spin" in modes else ""
    print(header)
    for world in args.worlds:
        figures = measure(world, modes, sizes, args.repeats, args.scale, args.timer_slack_ns)
        for nbytes in sizes:
            median = {m: statistics.median(figures[(m, nbytes)]) for m in modes}
            line = f"{world:>5} {show_size(nbytes):>7} " + " ".join(f"{median[m] * 1e6:>10.1f}" for m in modes)
            if "gloo" in modes:
                line += f"   {median['gloo'] / median['ours']:>9.1f}x"
            if "spin" in modes:
                line += f"   {median['spin'] / median['ours']:>9.2f}x"
            print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
