"""The row family on cards: the one-shot all-reduce (LL words, and through the slots) and the fused
all_reduce + residual add + rmsnorm, against allreduce.cu's kernels, the unfused chain and NCCL, in
the same run.

    PYTHONUNBUFFERED=1 python3 bench/allreduce_fused.py [--tests] [--ranks N] [--quick | --largest BYTES]

`--ranks N` (default 2) processes started with multiprocessing spawn, each pinned to card r % cards
(CUDA_VISIBLE_DEVICES), with HostPeers and, over their shared-memory board, DeviceP2P regions
(collectives/device_p2p.py): one a wire with room for the LL exchange at every size, and one with the
engine's defaults (what the picked form and the chain use). f32
activations of 8 KiB to 8 MiB a rank (--quick: to 1 MiB); for each size, K launches captured in one
CUDA graph and replayed R times, per op (the slower rank's, CUDA events):
  - all_reduce, f32 on the wire: ll, rows (the row kernel through the slots), one_shot, two_shot,
    and the form DevicePeers picks; bf16 on the wire: ll, rows;
  - the fused op on rows of 4096 (fewer for 8 KiB): f32 and bf16 on the wire, each exchange, and the
    chain it replaces (the all_reduce row, then libr4d's r4dchain_add_dev and r4dchain_rmsnorm_dev,
    chained as the engine launches them on Hopper);
  - NCCL's all_reduce of the same f32 tensor through torch.distributed, plain and captured the same
    way (NVLink multicast off: NCCL_NVLS_ENABLE=0), where torch is installed and each rank has a card.
Every size is first checked: each form's all-reduce and the fused op against the numpy mirror
(collectives/device_rows_mirror.py), bit for bit, and the picked form against NCCL (at 2 ranks a + b).
With fewer cards than ranks (two processes on one card: the card time-slices them) only the checks
run: their times would measure the time slicing, not the kernels.
With RADIANCE_TEST_FAKE_KERNELS set (tests only: tests/test_bench_fused.py) every rank runs on a fake
card (radiance/device/fake.py) instead, its kernels' Python forms, two launches a graph replayed once:
the script's own checks, no speed.
--tests first runs tests/test_device_fused_card.py and tests/test_device_fused_host.py. Needs numpy,
cuda-bindings and pytest (torch for NCCL), which the H200 image carries; radiance need not be
installed (the checkout is mapped under `radiance.`). Writes $OUT/allreduce_fused.json.
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

KiB, MiB = 1 << 10, 1 << 20
SIZES = [8 * KiB << i for i in range(11)]          # 8 KiB .. 8 MiB
ROW = 4096                                         # the fused op's n (a Llama-3-8B hidden size)
EPS = 1e-5
K, R = 50, 3
AR_FORMS = [("f32", "ll"), ("f32", "rows"), ("f32", "one_shot"), ("f32", "two_shot"), ("f32", None),
            ("bf16", "ll"), ("bf16", "rows")]
FUSED_FORMS = [("f32", "ll"), ("f32", "rows"), ("bf16", "ll"), ("bf16", "rows")]


def shape(nbytes):
    count = nbytes // 4
    n = min(ROW, count)
    return count // n, n


def measure(rank, world, run_id, barrier, sizes, timed, store, report):
    """One rank, on card rank % cards: report["checks"] and, where timed, report["times"] filled."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank % int(os.environ.get("RADIANCE_BENCH_CARDS", "1")))
    import numpy as np

    from radiance.abi import RAD_DT_F32, RadArgs, rad_device_tensor
    from radiance.collectives import device_rows_mirror as mirror
    from radiance.collectives.device_p2p import DeviceP2P
    from radiance.collectives.device_peers import ShmBoard
    from radiance.collectives.peers import HostPeers
    from radiance.engine.running.device_stream import EngineStream
    from radiance.plugins.kernels.libr4d import device_rows

    host = HostPeers.create(run_id, rank, world, 4096)
    barrier.wait(timeout=120)
    host.attach()
    device = open_device()
    report["card"] = {"name": getattr(device, "name", device.vendor), "target": device.target,
                      "sms": getattr(device, "multiprocessors", None)}
    biggest = max(sizes)
    board = ShmBoard(host)
    peers = {wire: DeviceP2P(device, rank, world, biggest, board.exchange, wire=wire, ll_max_bytes=biggest)
             for wire in ("f32", "bf16")}   # LL room for every size, so every form can be timed everywhere
    picked = DeviceP2P(device, rank, world, biggest, board.exchange)   # the engine's defaults (f32 wire)
    stream = EngineStream(device)
    compute = {row.name: row.launch for row in device_rows.build_device_rows()}
    x, residual, y, spare = (device.alloc(biggest, name) for name in ("x", "residual", "y", "spare"))
    w = device.alloc(ROW * 4, "w")
    device.copy_to_device(w, np.linspace(0.5, 1.5, ROW, dtype=np.float32))
    rng = np.random.default_rng(rank)
    contributions = rng.standard_normal(biggest // 4, dtype=np.float32)
    everyone = [np.random.default_rng(r).standard_normal(biggest // 4, dtype=np.float32) for r in range(world)]
    start_residual = np.random.default_rng(99).standard_normal(biggest // 4, dtype=np.float32)

    def barrier_():
        stream.synchronize()
        board.exchange(b"")

    def reset(count):
        device.copy_to_device(x, contributions[:count], stream.handle)
        device.copy_to_device(residual, start_residual[:count], stream.handle)
        stream.synchronize()

    def read(buffer, count):
        out = np.empty(count, np.float32)
        device.copy_to_host(out, buffer, stream.handle)
        stream.synchronize()
        return out

    def all_reduce(wire, form, count):
        target = picked if form is None else peers[wire]
        return lambda: target.all_reduce(x.ptr, spare.ptr, count, "f32", stream=stream.handle, form=form)

    def fused(wire, form, m, n):
        return lambda: peers[wire].all_reduce_add_rmsnorm(x.ptr, residual.ptr, w.ptr, y.ptr, m, n, EPS,
                                                         stream=stream.handle, form=form)

    def chain(m, n):
        """The all-reduce the engine picks (in place, as the row launches it), then libr4d's add and
        rmsnorm rows."""
        t = lambda buffer, cols=n: rad_device_tensor(buffer.ptr, RAD_DT_F32, (m, cols), 4)
        add = RadArgs(t=(t(residual), t(x), t(residual)), params={"M": m, "n": n, "dtype": "f32"}, stream=stream)
        norm = RadArgs(t=(t(residual), rad_device_tensor(w.ptr, RAD_DT_F32, (n,), 4), t(y)),
                       params={"M": m, "n": n, "eps": EPS, "dtype": "f32"}, stream=stream)

        def run():
            picked.all_reduce(x.ptr, x.ptr, m * n, "f32", stream=stream.handle)
            stream.programmatic = device.programmatic_launch   # chained rows, as the engine launches them
            compute["r4dchain_add_dev"](add)
            compute["r4dchain_rmsnorm_dev"](norm)
            stream.programmatic = False
        return run

    k, r = (2, 1) if device.vendor == "fake" else (K, R)

    def graphed(launch):
        return round(graph_us(device, stream.handle, launch, k, r, barrier_, warmup=3), 2)

    nccl = _nccl(rank, world, store) if timed and device.vendor == "cuda" else None
    for nbytes in sizes:
        count, (m, n) = nbytes // 4, shape(nbytes)
        parts = [part[:count] for part in everyone]
        checks = report["checks"][nbytes] = {}
        for wire, form in ar_forms(device):
            reset(count)
            all_reduce(wire, form, count)()
            want = mirror.rank_order_sum(parts, wire)
            checks[f"all_reduce {wire} {form}"] = bool(np.array_equal(read(spare, count).view(np.uint32),
                                                                      want.view(np.uint32)))
        checks["picked"] = picked.form_for(nbytes)
        for wire, form in FUSED_FORMS:
            reset(count)
            fused(wire, form, m, n)()
            want = mirror.fused([p.reshape(m, n) for p in parts], start_residual[:count].reshape(m, n),
                                np.linspace(0.5, 1.5, ROW, dtype=np.float32)[:n], EPS, wire)
            got = [read(buffer, count).reshape(m, n) for buffer in (x, residual, y)]
            checks[f"fused {wire} {form}"] = all(np.array_equal(a.view(np.uint32), b.view(np.uint32))
                                                  for a, b in zip(got, want))
        if nccl is not None and world == 2:   # NCCL adds in its own order; at 2 ranks a + b is ours
            reset(count)
            all_reduce("f32", None, count)()
            checks["equals_nccl"] = nccl.check(read(spare, count), contributions[:count])
        if not timed:
            continue
        times = report["times"][nbytes] = {}
        for wire, form in ar_forms(device):
            times[f"all_reduce {wire} {form or 'picked'}"] = graphed(all_reduce(wire, form, count))
        for wire, form in FUSED_FORMS:
            times[f"fused {wire} {form}"] = graphed(fused(wire, form, m, n))
        times["chain f32"] = graphed(chain(m, n))
        if nccl is not None:
            times["nccl"] = nccl.graphed(count, k, r, barrier_)
        if rank == 0:
            print(f"  {nbytes:>9} B done", flush=True)
    barrier_()
    report["timed_out"] = [p.timed_out(stream.handle) for p in (*peers.values(), picked)]
    for p in (*peers.values(), picked):
        p.close()
    board.close()
    barrier.wait(timeout=120)
    host.close()


def open_device():
    if os.environ.get("RADIANCE_TEST_FAKE_KERNELS"):
        from radiance.device.fake import open_device as open_fake
        return open_fake()
    from radiance.device import CompileCache
    from radiance.device.cuda import CudaDevice
    return CudaDevice(cache=CompileCache(tempfile.mkdtemp(prefix="radk")))


def ar_forms(device):
    """The fake card's Python forms have no two-shot kernel (tests/fixtures/fakecard.py)."""
    return [(wire, form) for wire, form in AR_FORMS if device.vendor != "fake" or form != "two_shot"]


class _Nccl:
    """torch.distributed's NCCL over the same cards: one f32 tensor, checked and timed in a graph."""

    def __init__(self, torch, dist, rank):
        self.torch, self.dist, self.rank = torch, dist, rank

    def check(self, ours, contribution):
        t = self.torch.from_numpy(contribution.copy()).cuda()
        self.dist.all_reduce(t)
        self.torch.cuda.synchronize()
        return bool((t.cpu().numpy().view("uint32") == ours.view("uint32")).all())

    def graphed(self, count, k, r, barrier_):
        t = self.torch.randn(count, dtype=self.torch.float32, device="cuda")
        return round(nccl_graph_us(self.torch, self.dist, t, k, r, barrier_), 2)


def _nccl(rank, world, store):
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return None
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.FileStore(store, world), rank=rank, world_size=world,
                            device_id=torch.device("cuda", 0))
    return _Nccl(torch, dist, rank)


def visible_cards() -> int:
    try:
        from cuda.bindings import driver
        if int(driver.cuInit(0)[0]) != 0:
            return 0
        return int(driver.cuDeviceGetCount()[1])
    except Exception:  # noqa: BLE001  (no bindings, or no driver: no card)
        return 0


def combine(reports):
    """Per size and column: the slower rank's time; the checks, all ranks together."""
    rows = {}
    for nbytes in reports[0]["checks"]:
        checks = {key: all(r["checks"][nbytes][key] for r in reports) for key in reports[0]["checks"][nbytes]
                  if key != "picked"}
        row = {"picked": reports[0]["checks"][nbytes]["picked"], "checks": checks}
        if nbytes in reports[0]["times"]:
            row["us"] = {key: max(r["times"][nbytes][key] for r in reports) for key in reports[0]["times"][nbytes]}
        rows[nbytes] = row
    return rows


def table(rows):
    columns = ["all_reduce f32 ll", "all_reduce f32 rows", "all_reduce f32 one_shot", "all_reduce f32 two_shot",
               "all_reduce f32 picked", "all_reduce bf16 ll", "fused f32 ll", "fused f32 rows", "fused bf16 ll",
               "chain f32", "nccl"]
    short = ["ll", "rows", "1-shot", "2-shot", "picked", "bf16 ll", "fused ll", "fused rows", "fused bf16", "chain",
             "NCCL"]
    lines = [f"{'size':>9} | " + " | ".join(f"{s:>10}" for s in short) + " | picked / NCCL | checks"]
    for nbytes, row in rows.items():
        us = row.get("us", {})
        cells = [f"{us[c]:>10.2f}" if c in us else f"{'-':>10}" for c in columns]
        ratio = f"{us['all_reduce f32 picked'] / us['nccl']:.2f}" if "nccl" in us else "-"
        ok = "all exact" if all(row["checks"].values()) else \
            "FAILED: " + ", ".join(k for k, v in row["checks"].items() if not v)
        lines.append(f"{nbytes:>9} | " + " | ".join(cells) + f" | {ratio:>13} | {ok}")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", action="store_true", help="run the card and host tests of the row family first")
    parser.add_argument("--ranks", type=int, default=2, help="processes, one a card where there are enough (2 to 8)")
    parser.add_argument("--quick", action="store_true", help="8 KiB to 1 MiB")
    parser.add_argument("--largest", type=int, default=max(SIZES), help="the largest size, bytes a rank")
    options = parser.parse_args()
    if not 2 <= options.ranks <= 8:
        parser.error(f"--ranks {options.ranks}: 2 to 8")
    world, out = options.ranks, os.environ.get("OUT")
    cards = world if os.environ.get("RADIANCE_TEST_FAKE_KERNELS") else visible_cards()
    timed = cards >= world
    results = {"python": sys.version.split()[0], "cards": cards, "ranks": world, "timed": timed, "K": K, "R": R,
               "command": "python3 bench/allreduce_fused.py" + (" --tests" if options.tests else "") +
               f" --ranks {world}" + (" --quick" if options.quick else "") +
               (f" --largest {options.largest}" if options.largest != max(SIZES) else "")}
    if not timed:
        print(f"{cards} card(s) for {world} ranks: the ranks share cards, so only the checks run", flush=True)
    if options.tests:
        results["tests"] = run_tests(out, ["tests/test_device_fused_card.py", "tests/test_device_fused_host.py"],
                                     "allreduce_fused_tests.log", 400)
    if cards == 0:
        results["errors"] = ["no NVIDIA card"]
    else:
        from radiance.collectives.shm import new_run_id, unlink_run
        os.environ["RADIANCE_BENCH_CARDS"] = str(cards)
        sizes = [s for s in SIZES if s <= (MiB if options.quick else options.largest)]
        context, run_id = mp.get_context("spawn"), new_run_id()
        store = str(Path(tempfile.mkdtemp(prefix="radfused")) / "store")
        reports, results["seconds"] = run_ranks(context, measure, world,
                                                (world, run_id, context.Barrier(world), sizes, timed, store),
                                                {"times": {}, "checks": {}}, 900)
        unlink_run(run_id)
        if take_reports(reports, results):
            results["rows"] = combine(reports)
            print(table(results["rows"]), flush=True)
    if out:
        Path(out, "allreduce_fused.json").write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps({k: v for k, v in results.items() if k != "rows"}, indent=1, default=str), flush=True)
    failed = results.get("errors") or (results.get("tests", {}).get("returncode", 0) != 0) or \
        any(not all(row["checks"].values()) for row in results.get("rows", {}).values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
