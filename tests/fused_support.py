"""What the row family's multi-process tests share, on fake cards (test_device_fused_fake.py) and on a
card (test_device_fused_card.py): one spawned process a rank runs `rank_checks` once over a plan and
reports plain data; the tests compare it with the numpy mirror (collectives/device_rows_mirror.py).

Per form of the plan (P2P or host-staged, f32 or bf16 on the wire), per shape [M, n]:
  - the chain as the graph runs it unfused: libr4d's all_reduce_p2p[_host] row, then its device add
    and rmsnorm rows (r4dchain_add_dev, r4dchain_rmsnorm_dev);
  - the fused row, libr4d's all_reduce_add_rmsnorm_p2p[_host], on the same inputs;
  - both exchanges forced (ll, rows), the fused op and the plain all-reduce;
  - three fused launches captured in one graph (with the gate memsets the executor issues), replayed
    three times with new inputs;
  - a run of launches with the ranks at random speeds, each result checked against the mirror.
Inputs are seeded per (rank, shape); the residual and the weight are the same on every rank, as a
model's are."""

import mmap
import os
import random
import time
import traceback

import numpy as np

from radiance.collectives import device_rows_family as family, device_rows_mirror as mirror

EPS = 1e-5
NAMES = ("x", "residual", "y")


def contribution(rank, m, n, seed):
    rng = np.random.default_rng([seed, rank, m, n])
    return (rng.standard_normal((m, n)) * np.exp2(rng.integers(-6, 6, (m, n)))).astype(np.float32)


def residual_of(m, n, seed):
    return np.random.default_rng([seed, 77, m, n]).standard_normal((m, n)).astype(np.float32)


def weight_of(n):
    return np.linspace(0.5, 1.5, n, dtype=np.float32)


def bits(arrays) -> dict:
    return {name: np.ascontiguousarray(array, np.float32).view(np.uint32).tobytes() for name, array in arrays.items()}


def mirror_bits(world, m, n, seed, wire) -> dict:
    """What the fused row (and the chain) must leave, by the mirror."""
    want = mirror.fused([contribution(r, m, n, seed) for r in range(world)], residual_of(m, n, seed), weight_of(n),
                        EPS, wire)
    return bits(dict(zip(NAMES, want)))


def replayed_bits(world, m, n, seed, wire, launches=3) -> dict:
    """Three fused launches in a row, each on the last one's x and residual."""
    x, residual = [contribution(r, m, n, seed) for r in range(world)], residual_of(m, n, seed)
    for _ in range(launches):
        x_sum, residual, y = mirror.fused(x, residual, weight_of(n), EPS, wire)
        x = [x_sum] * world
    return bits({"x": x_sum, "residual": residual, "y": y})


def form_name(p2p: bool, wire: str) -> str:
    return f"{'p2p' if p2p else 'host'} {wire}"


def rank_main(rank, world, run_id, barrier, queue, plan, environment):
    """A spawned rank: `environment` first (the card it sees, the kernel cache), then the checks."""
    os.environ.update(environment)
    report = {"rank": rank}
    try:
        rank_checks(rank, world, run_id, barrier, report, plan)
    except Exception as error:  # noqa: BLE001  (reported to the test, which fails naming it)
        report["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    queue.put(report)


def open_device(kind):
    if kind == "cuda":
        import tempfile

        from radiance.device import CompileCache
        from radiance.device.cuda import CudaDevice
        return CudaDevice(cache=CompileCache(tempfile.mkdtemp(prefix="radk")))
    import importlib.util
    from pathlib import Path

    from radiance.device.fake import FakeDevice
    spec = importlib.util.spec_from_file_location("fakecard", Path(__file__).parent / "fixtures" / "fakecard.py")
    fakecard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fakecard)
    return FakeDevice(fakecard.kernels())


def rank_checks(rank, world, run_id, barrier, report, plan):
    from radiance.abi import RAD_DT_F32, RAD_LINK_ENDED, RAD_OK, RadArgs, rad_device_tensor
    from radiance.collectives.device_peers import DevicePeers
    from radiance.collectives.peers import HostPeers
    from radiance.collectives.shm import list_run
    from radiance.engine.running.device_stream import EngineStream
    from radiance.plugins.kernels.libr4d import collectives_device, device_rows

    host = HostPeers.create(run_id, rank, world, 4096)
    barrier.wait(timeout=120)
    host.attach()
    device = open_device(plan["device"])
    report["card"] = {"target": device.target, "vendor": device.vendor}
    compute = {row.name: row.launch for row in device_rows.build_device_rows()}
    collective = {info.name: info.launch for info, _ in collectives_device.DEVICE_ROWS}
    page = mmap.mmap(-1, mmap.PAGESIZE)   # the gate word: a page of its own, as the engine's is
    word = np.frombuffer(page, np.uint64, count=1)
    gate = device.map_host(word)
    width = max(m * n for m, n in plan["shapes"])
    buffers = {name: device.alloc(width * 4, name) for name in NAMES}
    w = device.alloc(max(n for _, n in plan["shapes"]) * 4, "w")
    stream = EngineStream(device)

    def tensor(name, m, n):
        return rad_device_tensor(buffers[name].ptr, RAD_DT_F32, (m, n), 4)

    def weight(n):
        return rad_device_tensor(w.ptr, RAD_DT_F32, (n,), 4)

    def put(m, n, seed):
        device.copy_to_device(buffers["x"], contribution(rank, m, n, seed), stream.handle)
        device.copy_to_device(buffers["residual"], residual_of(m, n, seed), stream.handle)
        device.copy_to_device(w, weight_of(n), stream.handle)
        device.copy_to_device(buffers["y"], np.full((m, n), np.nan, np.float32), stream.handle)
        stream.synchronize()

    def got(m, n, names=NAMES):
        stream.synchronize()
        out = {}
        for name in names:
            out[name] = np.empty((m, n), np.float32)
            device.copy_to_host(out[name], buffers[name], stream.handle)
        stream.synchronize()
        return bits(out)

    def fused_args(peers, m, n, on=None):
        return RadArgs(t=(tensor("x", m, n), tensor("residual", m, n), weight(n), tensor("y", m, n)),
                       params={"M": m, "n": n, "eps": EPS, "dtype": "f32"}, stream=on or stream, peers=peers,
                       link_gate=gate)

    def chain(peers, twin, m, n):
        """all_reduce_p2p[_host], then libr4d's device add and rmsnorm rows, as the graph runs them."""
        stream.memset32(gate, 1, 1)
        reduce = RadArgs(t=(tensor("x", m, n),), params={"M": m, "n": n, "dtype": "f32"}, stream=stream, peers=peers,
                         link_gate=gate)
        statuses = [collective["all_reduce_p2p" + twin](reduce)]
        add = RadArgs(t=(tensor("residual", m, n), tensor("x", m, n), tensor("residual", m, n)),
                      params={"M": m, "n": n, "dtype": "f32"}, stream=stream)
        statuses.append(compute["r4dchain_add_dev"](add))
        norm = RadArgs(t=(tensor("residual", m, n), weight(n), tensor("y", m, n)),
                       params={"M": m, "n": n, "eps": EPS, "dtype": "f32"}, stream=stream)
        statuses.append(compute["r4dchain_rmsnorm_dev"](norm))
        return statuses == [RAD_LINK_ENDED, RAD_OK, RAD_OK]

    for p2p, wire in plan["forms"]:
        peers = DevicePeers(device, host, p2p=p2p, buffer_bytes=plan["buffer"], wire=wire,
                            ll_max_bytes=plan.get("ll_max"))
        twin = "" if p2p else "_host"
        result = report[form_name(p2p, wire)] = {}
        for m, n in plan["shapes"]:
            seed = m * 1000 + n
            put(m, n, seed)
            chain_ok = chain(peers, twin, m, n)
            unfused = got(m, n)
            put(m, n, seed)
            word[0] = 5
            stream.memset32(gate, 1, 1)
            status = collective["all_reduce_add_rmsnorm_p2p" + twin](fused_args(peers, m, n))
            fused = got(m, n)
            result[f"{m}x{n}"] = {"chain_ok": chain_ok, "fused_ended": status == RAD_LINK_ENDED, "gate": int(word[0]),
                                  "fused": fused, "unfused": unfused, "form": peers.impl.form_for(m * n * 4)}
            for form in ("ll", "rows"):   # both exchanges forced: the fused op, and the plain all-reduce
                if form == "ll" and m * n * 4 > peers.impl.ll_max_bytes:
                    continue   # the slot holds LL words up to the limit only
                put(m, n, seed)
                peers.impl.all_reduce_add_rmsnorm(buffers["x"].ptr, buffers["residual"].ptr, w.ptr, buffers["y"].ptr,
                                                  m, n, EPS, stream=stream.handle, form=form)
                result[f"{m}x{n} fused {form}"] = got(m, n)
                put(m, n, seed)
                peers.impl.all_reduce(buffers["x"].ptr, buffers["x"].ptr, m * n, "f32", stream=stream.handle, form=form)
                result[f"{m}x{n} all_reduce {form}"] = got(m, n, ("x",))
        # three fused launches captured in one graph, replayed three times with new inputs
        m, n = plan["shapes"][0]
        capture = device.stream()
        captured = EngineStream(device, capture)
        device.begin_capture(capture)
        for _ in range(3):
            captured.memset32(gate, 1, 1)
            collective["all_reduce_add_rmsnorm_p2p" + twin](fused_args(peers, m, n, captured))
        graph = device.instantiate(device.end_capture(capture))
        replays = []
        for replay in range(3):
            put(m, n, 500 + replay)
            word[0] = 5
            device.launch_graph(graph, capture)
            device.synchronize(capture)
            replays.append({"arrays": got(m, n), "gate": int(word[0])})
        result["replays"] = replays
        # the ranks at random speeds: the two exchanges in turn (where LL fits), each result checked here
        rng = random.Random(rank * 7919 + world)
        skewed = []
        for step in range(plan["skewed"]):
            m, n = plan["shapes"][step % len(plan["shapes"])]
            time.sleep(rng.random() * 0.01)
            put(m, n, 900 + step)
            form = ("ll", "rows")[step % 2] if m * n * 4 <= peers.impl.ll_max_bytes else "rows"
            peers.impl.all_reduce_add_rmsnorm(buffers["x"].ptr, buffers["residual"].ptr, w.ptr, buffers["y"].ptr, m, n,
                                              EPS, stream=stream.handle, form=form)
            skewed.append(got(m, n) == mirror_bits(world, m, n, 900 + step, wire))
        result["skewed"] = skewed
        result["timed_out"] = peers.timed_out()
        stream.synchronize()
        peers.close()
    barrier.wait(timeout=120)   # every rank has closed
    report["left"] = [name for name in list_run(run_id) if ".devpeers." in name]
    device.unmap_host(word)
    host.close()


def check_reports(world, ranks, plan):
    """Every assertion of the plan's results (a test calls it per form)."""
    failures, ll_max = [], plan.get("ll_max") or family.LL_MAX_BYTES
    for report in ranks:
        for p2p, wire in plan["forms"]:
            form = form_name(p2p, wire)
            result = report[form]
            for m, n in plan["shapes"]:
                seed, case = m * 1000 + n, result[f"{m}x{n}"]
                want = mirror_bits(world, m, n, seed, wire)
                where = (report["rank"], form, m, n)
                if not (case["chain_ok"] and case["fused_ended"] and case["gate"] == 0):
                    failures.append((where, "a row's status or the gate"))
                if case["fused"] != case["unfused"]:
                    failures.append((where, "the fused row differs from the chain"))
                if case["fused"] != want:
                    failures.append((where, "the fused row differs from the mirror"))
                for exchange in ("ll", "rows"):
                    if exchange == "ll" and m * n * 4 > ll_max:
                        continue   # not run: the slot holds LL words up to the limit only
                    if result[f"{m}x{n} fused {exchange}"] != want:
                        failures.append((where, f"fused, {exchange} forced"))
                    if result[f"{m}x{n} all_reduce {exchange}"] != {"x": want["x"]}:
                        failures.append((where, f"all_reduce, {exchange} forced"))
            m, n = plan["shapes"][0]
            for replay, got in enumerate(result["replays"]):
                if got != {"arrays": replayed_bits(world, m, n, 500 + replay, wire), "gate": 0}:
                    failures.append(((report["rank"], form), f"graph replay {replay}"))
            if result["skewed"] != [True] * plan["skewed"]:
                failures.append(((report["rank"], form), f"skewed launches {result['skewed']}"))
            if result["timed_out"] is not False:
                failures.append(((report["rank"], form), "a wait timed out"))
        if report["left"]:
            failures.append(((report["rank"],), f"left in /dev/shm: {report['left']}"))
    return failures
