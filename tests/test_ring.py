"""The broadcast ring between real processes over real shared memory: every reader gets every
record in order, across many wrap-arounds of a few slots; a reader that dies ends the writer's wait
naming it, and so does a writer that dies for its readers; a waiting reader sleeps; a record that
does not verify, one too large and a segment others may open are refused; nothing stays in /dev/shm.
Readers each way a slot is copied and checked: in Python (hashlib) and in one call of libr4d's
r4d_ring.c (`native`), reading what the writer signed with hashlib."""

import multiprocessing as mp
import os
import secrets
import time
import traceback

import numpy as np
import pytest

from radiance.abi import host_helpers
from radiance.collectives.ring import SLOT_HEADER, PeerGone, RingError, RingReader, RingTimeout, RingWriter
from radiance.collectives.ring_record import RecordCodec, ops_arrays, pop_ops
from radiance.collectives.shm import list_run, new_run_id, unlink_run

SECRET = secrets.token_bytes(32)  # handed to every process: a spawned one imports this file anew


def _record(k: int) -> bytes:
    """Record k's bytes: its length varies (0 to 3000) and every byte depends on k."""
    size = (k * 397) % 3001
    return k.to_bytes(8, "little") + bytes((k + i) % 251 for i in range(size))


def use_ring_take(way: str) -> None:
    """The readers this process makes from now on copy and check slots in Python ("python") or with
    r4d_ring.c ("native"), as a rank's do once libr4d has offered it (abi/host_helpers.py; loading
    libr4d anywhere in the process offers it, so a test of the Python way withdraws it). Skips where
    libr4d does not build. test_plan_record.py takes its readers the same way."""
    take = None
    if way == "native":
        from radiance.plugins.kernels.libr4d import native

        try:
            take = native.load().lib.r4d_ring_take_p
        except native.NativeUnavailable as why:
            pytest.skip(f"libr4d does not build here: {why}")
    host_helpers.offer("ring_take", take)


@pytest.fixture(params=["python", "native"], ids=lambda way: f"{way}-readers")
def way(request):
    """How the readers copy and check (the writer signs with hashlib either way, so a native
    reader reads what Python wrote); this process back to Python after."""
    yield request.param
    use_ring_take("python")


def _read(reader, buffer, timeout=1):
    """The next record's bytes (into `buffer`, as a rank takes its plans: r4d_ring.c's way where the
    reader was made with it)."""
    return bytes(reader.read(timeout=timeout, into=buffer))


def _reader(run_id, secret, index, count, queue, die_after=None, hold=0.0, way="python"):
    report = {"index": index}
    try:
        use_ring_take(way)
        reader = RingReader.attach(run_id, "plans", index, secret)
        buffer = memoryview(bytearray(reader.slot_bytes)) if way == "native" else None
        queue.put({"index": index, "attached": True})
        got = []
        for n in range(count):
            if die_after is not None and n == die_after:
                os._exit(3)
            payload = bytes(reader.read(timeout=30, into=buffer))
            got.append(payload == _record(n + 1))
            if hold:
                time.sleep(hold)
        report["ok"] = all(got) and len(got) == count
        reader.close()
    except Exception as error:  # noqa: BLE001
        report["error"] = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    queue.put(report)


@pytest.fixture
def run_id():
    run = new_run_id()
    yield run
    left = unlink_run(run)  # removed whatever the test did, so a failing test leaves nothing either
    assert left == [], f"the test left segments behind: {left}"


def _start(run_id, readers, count, options=None, way="python"):
    """Reader processes, attached; `options[i]`: reader i's keyword arguments; `way`: how they read."""
    options = options or {}
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_reader, args=(run_id, SECRET, i, count, queue),
                                 kwargs={"way": way, **options.get(i, {})})
                 for i in range(readers)]
    for process in processes:
        process.start()
    for _ in processes:
        assert queue.get(timeout=60)["attached"]
    return processes, queue


def test_every_reader_reads_every_record_in_order_across_wrap_arounds(run_id, way):
    readers, slots, count = 3, 4, 200  # 50 times round the ring
    writer = RingWriter.create(run_id, "plans", readers, slots, 4096, SECRET)
    processes, queue = _start(run_id, readers, count, {2: {"hold": 0.001}}, way)  # one slow reader
    try:
        for k in range(1, count + 1):
            assert writer.publish(_record(k), timeout=30) == k
        reports = sorted((queue.get(timeout=60) for _ in processes), key=lambda r: r["index"])
    finally:
        for process in processes:
            process.join(30)
        writer.close()
    for report in reports:
        assert report.get("ok"), report


def test_a_reader_that_dies_ends_the_writers_wait_naming_it(run_id, way):
    writer = RingWriter.create(run_id, "plans", 2, 2, 4096, SECRET)
    processes, queue = _start(run_id, 2, 50, {1: {"die_after": 3}}, way)
    try:
        started = time.monotonic()
        with pytest.raises(PeerGone, match=r"the plans ring: reader 1 \(pid \d+\) is gone before reading record 4"):
            for k in range(1, 51):
                writer.publish(_record(k), timeout=30)
        assert time.monotonic() - started < 5.0
        processes[1].join(10)
        assert processes[1].exitcode == 3
    finally:
        processes[0].kill()
        for process in processes:
            process.join(30)
        writer.close()


def _writer(run_id, secret, queue):
    writer = RingWriter.create(run_id, "plans", 1, 2, 4096, secret)
    queue.put("created")
    writer.publish(_record(1))
    time.sleep(0.3)
    os._exit(0)  # gone without closing: the test unlinks the segment


def test_a_writer_that_dies_ends_the_readers_wait_naming_it(run_id):
    context = mp.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_writer, args=(run_id, SECRET, queue))
    process.start()
    try:
        assert queue.get(timeout=60) == "created"
        reader = RingReader.attach(run_id, "plans", 0, SECRET)
        assert bytes(reader.read(timeout=10)) == _record(1)
        with pytest.raises(PeerGone, match=r"its writer \(pid \d+\) is gone before record 2"):
            reader.read(timeout=10)
        reader.close()
    finally:
        process.join(30)
        unlink_run(run_id)


def test_a_waiting_reader_sleeps_and_wakes_at_once(run_id):
    writer = RingWriter.create(run_id, "plans", 1, 2, 4096, SECRET)
    reader = RingReader.attach(run_id, "plans", 0, SECRET)
    try:
        with pytest.raises(RingTimeout, match="record 1 did not come in 0.5 s"):
            cpu = time.process_time()
            reader.read(timeout=0.5)
        assert time.process_time() - cpu < 0.1, "the reader burned its core while it waited"
        import threading

        threading.Timer(0.2, lambda: writer.publish(b"late")).start()
        started = time.monotonic()
        assert bytes(reader.read(timeout=5)) == b"late"
        assert time.monotonic() - started < 0.5
    finally:
        reader.close()
        writer.close()


def test_a_napping_reader_waits_on_no_futex_and_checks_once_a_slice(run_id):
    """poll_s (the coordinator running ahead): the reader naps instead of waiting on the futex, so
    it takes a late record within a nap or so, its writer's wake finding no one to wake, and its
    `check` runs once a slice (20 ms), not once a nap."""
    from radiance.collectives import futex

    writer = RingWriter.create(run_id, "plans", 1, 2, 4096, SECRET)
    reader = RingReader.attach(run_id, "plans", 0, SECRET)
    waits, checks, wait = [], [], futex.wait
    try:
        futex.wait = lambda *args: (waits.append(args), wait(*args))[1]
        import threading

        threading.Timer(0.2, lambda: writer.publish(b"late")).start()
        started, cpu = time.monotonic(), time.process_time()
        assert bytes(reader.read(timeout=5, check=lambda: checks.append(1), spin_s=0.0, poll_s=1e-3)) == b"late"
        waited = time.monotonic() - started
        assert 0.19 < waited < 0.5 and time.process_time() - cpu < 0.1
        assert waits == [] and 3 <= len(checks) <= 12, (len(waits), len(checks))
        with pytest.raises(RingTimeout, match="record 2 did not come in 0.1 s"):
            reader.read(timeout=0.1, spin_s=0.0, poll_s=1e-3)
    finally:
        futex.wait = wait
        reader.close()
        writer.close()


def test_a_writer_wakes_only_a_reader_that_sleeps(run_id):
    """No reader on the futex (a rank spinning for its plan, the coordinator napping): publish makes
    no system call; a reader asleep on the futex is woken, well before its 20 ms slice ends."""
    import threading

    from radiance.collectives import futex

    writer = RingWriter.create(run_id, "plans", 2, 2, 4096, SECRET)
    readers = [RingReader.attach(run_id, "plans", index, SECRET, slice_s=5.0) for index in range(2)]
    wakes, wake = [], futex.wake
    try:
        futex.wake = lambda address: (wakes.append(address), wake(address))[1]
        writer.publish(b"first")
        assert wakes == [] and [bytes(r.read(timeout=1)) for r in readers] == [b"first", b"first"]
        threading.Timer(0.2, lambda: writer.publish(b"second")).start()
        started = time.monotonic()
        assert bytes(readers[1].read(timeout=10, spin_s=0.0)) == b"second"   # asleep on the futex
        assert time.monotonic() - started < 2.0 and len(wakes) == 1, len(wakes)
        assert int(readers[1].sleeping[1]) == 0
    finally:
        futex.wake = wake
        for reader in readers:
            reader.close()
        writer.close()


def test_a_record_that_does_not_verify_is_refused(run_id, way):
    writer = RingWriter.create(run_id, "plans", 2, 2, 4096, SECRET)
    use_ring_take(way)
    honest = RingReader.attach(run_id, "plans", 0, SECRET)
    stranger = RingReader.attach(run_id, "plans", 1, secrets.token_bytes(32))
    buffer = memoryview(bytearray(writer.slot_bytes))
    try:
        writer.publish(b"step")
        with pytest.raises(RingError, match="record 1 does not verify under the launch's secret"):
            _read(stranger, buffer)
        writer.publish(b"step two")
        writer.slot(2)[64] ^= 1  # a byte changed after the mac was made
        assert _read(honest, buffer) == b"step"
        with pytest.raises(RingError, match="record 2 does not verify"):
            _read(honest, buffer)
    finally:
        honest.close(), stranger.close()
        writer.close()


def test_an_unsigned_stale_or_overlong_slot_is_refused(run_id, way):
    """A slot whose mac is zeros (written by anything but the writer), one that holds a record
    signed for another place in the sequence, one that claims more than a slot: each refused, in
    one line, before the reader counts the record consumed."""
    writer = RingWriter.create(run_id, "plans", 1, 2, 100, SECRET)
    use_ring_take(way)
    reader = RingReader.attach(run_id, "plans", 0, SECRET)
    buffer = memoryview(bytearray(writer.slot_bytes))
    try:
        writer.publish(b"one"), writer.publish(b"two")
        writer.slot(1)[:32] = 0  # record 1 unsigned
        with pytest.raises(RingError, match="record 1 does not verify under the launch's secret"):
            _read(reader, buffer)
        assert int(reader.consumed[0]) == 0
        writer.slot(1)[:] = writer.slot(2)  # record 2's signed slot where record 1 is read
        with pytest.raises(RingError, match="slot of record 1 holds record 2"):
            _read(reader, buffer)
        writer.slot(1)[40:48] = np.frombuffer((writer.capacity + 1).to_bytes(8, "little"), np.uint8)
        with pytest.raises(RingError, match=rf"record 1 claims {writer.capacity + 1} bytes, over its "
                                            rf"{writer.capacity}-byte slot"):
            _read(reader, buffer)
        assert int(reader.consumed[0]) == 0
    finally:
        reader.close()
        writer.close()


def test_r4d_ring_signs_as_hashlib_does():
    """r4d_ring.c's keyed BLAKE2b against hashlib's, across the block boundaries (128 bytes) and key
    lengths; a key it cannot take is refused, not hashed."""
    import ctypes
    import hashlib

    from radiance.plugins.kernels.libr4d import native

    try:
        lib = native.load().lib
    except native.NativeUnavailable as why:
        pytest.skip(f"libr4d does not build here: {why}")
    generator = np.random.default_rng(5)
    out = ctypes.create_string_buffer(32)
    for size in (0, 1, 32, 127, 128, 129, 256, 257, 3001):
        for key_bytes in (1, 32, 64):
            key, data = generator.bytes(key_bytes), generator.bytes(size)
            assert lib.r4d_blake2b_keyed(out, key, key_bytes, data, size) == 0
            assert out.raw == hashlib.blake2b(data, key=key, digest_size=32).digest(), (size, key_bytes)
    assert lib.r4d_blake2b_keyed(out, bytes(65), 65, b"x", 1) == -1
    assert lib.r4d_blake2b_keyed(out, b"", 0, b"x", 1) == -1


def test_a_native_read_lands_in_the_buffer_it_is_given(run_id):
    """Read natively into a rank's buffer: the payload is a view of it at SLOT_HEADER; a buffer
    shorter than a slot is refused by name."""
    use_ring_take("native")
    writer = RingWriter.create(run_id, "plans", 1, 2, 100, SECRET)
    reader = RingReader.attach(run_id, "plans", 0, SECRET)
    try:
        buffer = memoryview(bytearray(writer.slot_bytes))
        writer.publish(b"plan")
        view = reader.read(timeout=1, into=buffer)
        assert bytes(view) == b"plan" and bytes(buffer[SLOT_HEADER:SLOT_HEADER + 4]) == b"plan"
        writer.publish(b"next")
        with pytest.raises(RingError, match=rf"a 10-byte buffer to read {writer.slot_bytes}-byte slots into"):
            reader.read(timeout=1, into=memoryview(bytearray(10)))
    finally:
        use_ring_take("python")
        reader.close()
        writer.close()


def test_a_record_over_the_slot_is_a_clear_error(run_id):
    writer = RingWriter.create(run_id, "plans", 1, 2, 100, SECRET)
    try:
        with pytest.raises(RingError, match=r"a 5000-byte record does not fit its 4032-byte slots"):
            writer.publish(bytes(5000))
    finally:
        writer.close()


def test_a_segment_others_may_open_is_refused(run_id):
    writer = RingWriter.create(run_id, "plans", 1, 2, 100, SECRET)
    try:
        assert oct(os.stat(writer.segment.path).st_mode & 0o777) == "0o600"
        os.chmod(writer.segment.path, 0o644)
        with pytest.raises(RingError, match=r"is not this user's alone \(owner \d+, mode 644\): refused"):
            RingReader.attach(run_id, "plans", 0, SECRET)
        with pytest.raises(RingError, match="the results ring .* does not exist"):
            RingReader.attach(run_id, "results", 0, SECRET)
    finally:
        writer.close()


def test_records_carry_kind_meta_and_arrays_as_views():
    codec = RecordCodec()
    arrays = {"ids": np.arange(5, dtype=np.int32), "table": np.arange(12, dtype=np.int32).reshape(3, 4),
              "rng": np.array([[7, 1]], np.uint64), "empty": np.zeros(0, np.float32), "t": np.float32([0.5])}
    for meta in ({}, {"compute": 0.25}):
        for _ in range(2):  # the second time from the cached header and layout
            payload = codec.encode("step", meta, arrays)
            kind, got_meta, got = codec.decode(payload)
            assert kind == "step" and got_meta == meta and list(got) == list(arrays)
            for name, array in arrays.items():
                assert got[name].dtype == array.dtype and np.array_equal(got[name], array)


def test_a_profiled_result_carries_its_ops_with_no_json_a_step():
    """Seconds by op go as one array named by the ops: the second record of the same ops reuses the
    first's header (the same bytes up to the arrays), and the ops come back by name, in order."""
    codec = RecordCodec()
    payloads = []
    for seconds in ((0.5, 0.25, 0.125), (1.0, 2.0, 3.0)):
        ops = dict(zip(("gemm", "all_reduce", "rope_attention"), seconds))
        payloads.append(codec.encode("result", None, {"tokens": np.int64([7]), **ops_arrays(ops)}))
        kind, meta, arrays = codec.decode(payloads[-1])
        assert pop_ops(arrays) == ops and list(arrays) == ["tokens"] and meta == {}
    assert len(payloads[0]) == len(payloads[1]) and payloads[0][:-24] == payloads[1][:-24]
    assert pop_ops({"tokens": np.int64([7])}) is None and ops_arrays({}) == {}
