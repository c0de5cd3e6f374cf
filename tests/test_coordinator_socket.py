"""The coordinator's socket, written to by a process of the same user that is not a rank: a flood
of unsigned messages costs the launch a bounded share of the coordinator's time and is logged while
it comes; a signed message naming a rank the launch does not have ends the launch with one line
naming it, not an IndexError. Real launches, a real zmq client."""

import os
import threading
import time

import zmq

from launch_support import Launch, wait_gone
from radiance.collectives.wire import DROP_SECONDS, Wire

FLOOD_CAP_SECONDS = 180.0


def flood(endpoint: str, stop: threading.Event, sent: list) -> None:
    """Unsigned messages as fast as this thread can send them, until `stop` or the cap: each with a
    64 KiB array frame, so checking its mac costs the coordinator more than sending it costs this."""
    context = zmq.Context()
    rogue = context.socket(zmq.DEALER)
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(endpoint)
    deadline = time.monotonic() + FLOOD_CAP_SECONDS
    frames = [b"\x00" * 32, b"heartbeat", b'{"meta": {"rank": 0}, "arrays": {}}', bytes(65536)]
    while not stop.is_set() and time.monotonic() < deadline:
        for _ in range(100):
            try:
                rogue.send_multipart(frames, flags=zmq.NOBLOCK)
                sent[0] += 1
            except zmq.Again:
                time.sleep(0.0005)
    sent[1] = stop.is_set()
    rogue.close(0)
    context.term()


def test_a_flood_of_unsigned_messages_does_not_stall_the_launch(smollm2):
    launch = Launch("--tp", 1, "--model", smollm2, "--prompt", "The capital of France is", "--max-tokens", 8,
                    "--temperature", 0)
    ranks = launch.wait_for_ranks(1)
    stop, sent = threading.Event(), [0, False]
    rogue = threading.Thread(target=flood, args=(ranks[0].environ()["RADIANCE_COORDINATOR"], stop, sent))
    rogue.start()
    try:
        code, stdout, stderr = launch.finish(timeout=FLOOD_CAP_SECONDS + 60)
    finally:
        stop.set()
        rogue.join()
    assert code == 0, stderr[-3000:]
    assert sent[1], f"the launch ended only after the flood did ({sent[0]} messages in {FLOOD_CAP_SECONDS} s)"
    assert stdout.strip().startswith("Paris"), stdout
    assert "unauthenticated messages so far: a process of this user is writing to ipc://" in stderr, stderr[-3000:]
    assert wait_gone(launch) == []


def test_one_recv_spends_a_bounded_time_on_unsigned_messages(tmp_path):
    """20,000 unsigned messages queued on a ROUTER: one recv drops what it can in DROP_SECONDS and
    answers None, where it used to drop them all before answering; a signed message from a rank's
    socket still comes through (zmq takes the peers' queues in turn)."""
    context = zmq.Context()
    router, rogue, rank = context.socket(zmq.ROUTER), context.socket(zmq.DEALER), context.socket(zmq.DEALER)
    for socket in (router, rogue, rank):
        socket.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVHWM, 0)
    rogue.setsockopt(zmq.SNDHWM, 0)
    endpoint = f"ipc://{tmp_path / 'socket'}"
    router.bind(endpoint)
    rogue.connect(endpoint)
    rank.connect(endpoint)
    secret, count = b"s" * 32, 20_000
    wire = Wire(router, secret)
    try:
        for _ in range(count):
            rogue.send_multipart([b"\x00" * 32, b"heartbeat", b'{"meta": {}, "arrays": {}}', bytes(4096)])
        deadline = time.monotonic() + 30
        while router.getsockopt(zmq.EVENTS) & zmq.POLLIN == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # the I/O thread moves the rest into the router's queue
        started = time.monotonic()
        assert wire.recv(timeout_ms=0, routed=True) is None
        spent = time.monotonic() - started
        assert 0 < wire.dropped < count, wire.dropped
        assert spent < 50 * DROP_SECONDS, spent  # one message's cost past the budget, on a loaded machine
        Wire(rank, secret).send("heartbeat", {"rank": 0})
        message = None
        for _ in range(200):
            message = wire.recv(timeout_ms=10, routed=True)
            if message is not None:
                break
        assert message is not None and message[1] == "heartbeat" and message[2] == {"rank": 0}
    finally:
        for socket in (router, rogue, rank):
            socket.close(0)
        context.term()


def test_a_signed_heartbeat_naming_a_rank_the_launch_does_not_have(smollm2):
    launch = Launch("--tp", 1, "--model", smollm2, "--prompt", "Once upon a time", "--max-tokens", 2000,
                    "--temperature", 0, "--max-context", 2048)
    ranks = launch.wait_for_ranks(1)
    environment = ranks[0].environ()
    launch.read_until(" ")  # generating
    with open(environment["RADIANCE_SECRET_FILE"], "rb") as handle:
        secret = handle.read()
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 1000)
    socket.connect(environment["RADIANCE_COORDINATOR"])
    Wire(socket, secret).send("heartbeat", {"rank": 99})
    try:
        code, _, stderr = launch.finish(timeout=60)
    finally:
        socket.close()
        context.term()
    assert code == 1, stderr[-3000:]
    last = [line for line in stderr.splitlines() if line.strip()][-1]
    assert last == "radiance-launch: error: a signed 'heartbeat' names rank 99, not a rank of this launch (0 to 0)"
    assert "Traceback" not in stderr and "IndexError" not in stderr
    assert wait_gone(launch) == []
    assert not os.path.exists(os.path.dirname(environment["RADIANCE_SECRET_FILE"]))
