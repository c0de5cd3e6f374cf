"""libr4d's device collective rows and DevicePeers, what needs no card: the shared-memory exchange
between real processes (collectives/device_peers.py's ShmBoard over HostPeers), what close leaves
in /dev/shm, the rows' declarations and colours as the real Registry loads them, selection on the
device domain by device.p2p, the rows' refusals, and the host-staged compile option in the source.
The card half is tests/test_device_collectives_rows.py."""

import multiprocessing as mp
import traceback

import pytest

from radiance.abi import (
    RAD_C_EQ, RAD_DOMAIN_DEVICE, RAD_DT_F32, RAD_E_NOMEM, RAD_E_SHAPE, RAD_FACT_P2P, RadArgs, rad_device_tensor,
)
from radiance.collectives import device_p2p, device_peers
from radiance.collectives.peers import FLAG_DONE, FLAG_READY, N_FLAGS, HostPeers
from radiance.collectives.shm import list_run, new_run_id, unlink_run
from radiance.engine.loading.registry import Registry
from radiance.engine.selection.bands import SelectionError, resolve
from radiance.plugins.kernels.libr4d import collectives_device

from ranks_support import run_ranks

DEVICE_ROWS = {"all_reduce_p2p": ("all_reduce", 1), "all_reduce_p2p_host": ("all_reduce", 0),
               "all_gather_p2p": ("all_gather", 1), "all_gather_p2p_host": ("all_gather", 0)}


# ---- the exchange over shared memory, between real processes --------------------------------------

def _board_rank(run_id, rank, world, barrier, queue, generations, rounds):
    report = {"rank": rank, "got": []}
    try:
        host = HostPeers.create(run_id, rank, world, 4096)
        barrier.wait(timeout=60)
        host.attach()
        for g in range(generations):
            board = device_peers.ShmBoard(host, extra_bytes=3 * 4096 if g % 2 else 0, timeout_s=60)
            report.setdefault("generations", []).append(board.generation)
            if g % 2:   # the host-staged region after the board: every rank sees every rank's, zeroed
                report.setdefault("regions", []).append(
                    all(board.region(r, 3 * 4096).size == 3 * 4096 and not board.region(r, 3 * 4096).any()
                        for r in range(world)))
            for k in range(rounds):
                # payloads of varying length, the longest one the board takes
                size = device_peers.MAX_PAYLOAD if k == rounds - 1 else (rank * 7 + k * 13) % 200
                payload = bytes([(rank + k + g + i) % 251 for i in range(size)])
                report["got"].append(board.exchange(payload))
            board.close()
        barrier.wait(timeout=60)
        report["left"] = [n for n in list_run(run_id) if ".devpeers." in n]
        host.close()
    except Exception as error:  # noqa: BLE001
        report["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    queue.put(report)


@pytest.mark.parametrize("world", [2, 3])
def test_the_board_exchange_is_an_all_gather_between_processes_and_leaves_nothing(world):
    generations, rounds = 3, 9
    context, run_id = mp.get_context("spawn"), new_run_id()
    queue, barrier = context.Queue(), context.Barrier(world)
    processes = [context.Process(target=_board_rank, args=(run_id, r, world, barrier, queue, generations, rounds))
                 for r in range(world)]
    try:
        reports = run_ranks(processes, queue)
    finally:
        unlink_run(run_id)
    for report in reports:
        assert report["generations"] == [1, 2, 3]
        assert report["regions"] == [True]
        assert report["left"] == []
        got = iter(report["got"])
        for g in range(generations):
            for k in range(rounds):
                sizes = [device_peers.MAX_PAYLOAD if k == rounds - 1 else (r * 7 + k * 13) % 200 for r in range(world)]
                want = [bytes([(r + k + g + i) % 251 for i in range(sizes[r])]) for r in range(world)]
                assert next(got) == want, (report["rank"], g, k)


def test_the_board_flag_word_is_one_host_rows_never_touch():
    assert device_peers.FLAG_BOARD not in (FLAG_READY, FLAG_DONE) and device_peers.FLAG_BOARD < N_FLAGS


def test_a_payload_over_the_board_is_refused_and_close_unlinks():
    run_id = new_run_id()
    host = HostPeers.create(run_id, 0, 1, 4096)
    try:
        host.attach()
        board = device_peers.ShmBoard(host)
        assert any(".devpeers.0" in n for n in list_run(run_id))
        with pytest.raises(ValueError, match="payload"):
            board.exchange(bytes(device_peers.MAX_PAYLOAD + 1))
        assert board.exchange(b"alone") == [b"alone"]
        board.close()
        assert [n for n in list_run(run_id) if ".devpeers." in n] == []
    finally:
        host.close()
        unlink_run(run_id)


def test_a_missing_peer_times_out_naming_it():
    run_id = new_run_id()
    mine = HostPeers.create(run_id, 0, 2, 4096)
    other = HostPeers.create(run_id, 1, 2, 4096)   # exists, but never builds its board
    try:
        mine.attach()
        with pytest.raises(TimeoutError, match="rank 1's devpeers segment"):
            device_peers.ShmBoard(mine, timeout_s=0.2)
        assert [n for n in list_run(run_id) if ".devpeers." in n] == []   # the failed board unlinked its own
    finally:
        mine.close(), other.close()
        unlink_run(run_id)


# ---- the source and the engine side ---------------------------------------------------------------

def test_the_host_staged_form_compiles_the_same_source_with_its_option():
    text = device_p2p.source()
    assert device_peers.DeviceHostStaged.COMPILE_OPTIONS == ("-DRAD_P2P_HOST_MAPPED=1",)
    assert device_p2p.DeviceP2P.COMPILE_OPTIONS == ()
    code = "\n".join(line.split("//")[0] for line in text.splitlines())
    assert "#ifdef RAD_P2P_HOST_MAPPED" in code and "__threadfence_system()" in code
    assert '#define RAD_LD_PEER_COP "cv"' in code
    # no atomic may touch mapped host memory: the arrival counter and error word are peers.local's
    assert "(local + RAD_P2P_ARRIVE_OFF)" in code and "(peers.local + RAD_P2P_ERROR_OFF)" in code
    assert "own + RAD_P2P_ARRIVE_OFF" not in code and "own + RAD_P2P_ERROR_OFF" not in code
    assert "u64 local; };" in code


# ---- the rows ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def registry():
    reg = Registry(radiance_home="")
    yield reg
    reg.close()


def test_the_rows_are_declared_on_the_device_domain_with_colour_2(registry):
    rows = {row.name: row for op in ("all_reduce", "all_gather") for row in registry.rows_for(op)
            if row.plugin.name == "libr4d" and row.info.domain == RAD_DOMAIN_DEVICE}
    assert set(rows) == set(DEVICE_ROWS)
    for name, (op, p2p) in DEVICE_ROWS.items():
        row = rows[name]
        assert row.info.op == op and row.collective == 2 and not row.chain
        constraints = {(c.key, c.op, c.sval if c.sval is not None else c.ival) for c in row.info.constraints}
        assert constraints == {(RAD_FACT_P2P, RAD_C_EQ, p2p), ("dtype", RAD_C_EQ, "f32")}
    # the host rows are still there, unchanged, on the host domain
    host = {row.name for op in ("all_reduce", "all_gather") for row in registry.rows_for(op)
            if row.plugin.name == "libr4d" and row.info.domain != RAD_DOMAIN_DEVICE}
    assert {"all_reduce_host", "all_gather_host"} <= host and not host & set(DEVICE_ROWS)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("p2p", [1, 0])
def test_selection_on_the_device_domain_follows_device_p2p(registry, op, p2p):
    resolution = resolve(op, registry.ops[op].schema, registry.rows_for(op), {"n": 576, "dtype": "f32"},
                         {"device.p2p": p2p}, RAD_DOMAIN_DEVICE, 4096)
    expected = f"{op}_p2p" + ("" if p2p else "_host")
    assert [(b.lo, b.hi, b.row.name) for b in resolution.bands] == [(1, 4096, expected)]
    assert resolution.bands[0].row.plugin.name == "libr4d"
    assert any(f"does not hold (device.p2p is {p2p})" in why for _, why in resolution.bands[0].losers)


def test_selection_without_the_fact_names_the_rows(registry):
    with pytest.raises(SelectionError, match="device.p2p was not measured"):
        resolve("all_reduce", registry.ops["all_reduce"].schema, registry.rows_for("all_reduce"),
                {"n": 576, "dtype": "f32"}, {}, RAD_DOMAIN_DEVICE, 64)


class _Peers:
    """Only what the rows read before they launch: a refusal must come before any launch."""
    world_size, buffer_bytes = 2, 4096

    def all_reduce(self, *args):
        raise AssertionError("launched")

    all_gather = all_reduce


def _tensor(m, n, pitch_elements=None):
    t = rad_device_tensor(1 << 40, RAD_DT_F32, (m, n), 4)
    if pitch_elements is not None:
        t.pitch = (pitch_elements * 4,) + tuple(t.pitch[1:])
    return t


def test_rows_refuse_a_message_over_the_buffer_and_a_strided_operand_before_launching():
    peers = _Peers()
    big = RadArgs(t=(_tensor(2, 1024),), params={"n": 1024}, peers=peers, link_gate=1 << 30)
    assert collectives_device.all_reduce_device(big) == RAD_E_NOMEM
    gather = RadArgs(t=(_tensor(2, 1024), _tensor(2, 2048)), params={"n": 1024}, peers=peers)
    assert collectives_device.all_gather_device(gather) == RAD_E_NOMEM
    strided = RadArgs(t=(_tensor(1, 512, pitch_elements=1024),), params={"n": 512}, peers=peers)
    assert collectives_device.all_reduce_device(strided) == RAD_E_SHAPE
    narrow_y = RadArgs(t=(_tensor(1, 512), _tensor(1, 512)), params={"n": 512}, peers=peers)
    assert collectives_device.all_gather_device(narrow_y) == RAD_E_SHAPE
    flat = RadArgs(t=(rad_device_tensor(1 << 40, RAD_DT_F32, (512,), 4),), params={"n": 512}, peers=peers)
    assert collectives_device.all_reduce_device(flat) == RAD_E_SHAPE


def test_the_region_layout_fits_the_board_segment():
    region = device_p2p.region_bytes(8 << 20)
    assert region % 4096 == 0 and device_peers.BOARD_BYTES % 4096 == 0
    assert region >= device_p2p.CTRL_BYTES + 2 * (8 << 20)
    assert device_peers.MAX_PAYLOAD + 8 == device_peers.BOARD_BYTES // 3   # length word + payload: a page
