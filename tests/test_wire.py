"""Every message is signed with the launch's secret; one that is not is dropped and counted,
never decoded."""

import numpy as np
import zmq

from radiance.collectives.wire import Wire


def pair(tmp_path, secret_a=b"a" * 32, secret_b=b"a" * 32):
    context = zmq.Context.instance()
    server, client = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    endpoint = f"ipc://{tmp_path}/wire"
    server.bind(endpoint)
    client.connect(endpoint)
    return Wire(server, secret_a), Wire(client, secret_b)


def test_round_trip_with_arrays(tmp_path):
    server, client = pair(tmp_path)
    ids = np.arange(7, dtype=np.int32)
    table = np.ones((2, 3), np.uint64)
    client.send("step", {"n": 3}, {"ids": ids, "table": table})
    _, kind, meta, arrays = server.recv(timeout_ms=2000)
    assert (kind, meta) == ("step", {"n": 3})
    assert np.array_equal(arrays["ids"], ids) and arrays["table"].shape == (2, 3)


def test_a_message_under_another_secret_is_dropped_and_counted(tmp_path):
    server, rogue = pair(tmp_path, secret_b=b"b" * 32)
    rogue.send("stop")
    assert server.recv(timeout_ms=300) is None
    assert server.dropped == 1


def test_forged_frames_are_dropped(tmp_path):
    server, client = pair(tmp_path)
    client.socket.send_multipart([b"\x00" * 32, b"stop", b"{}"])
    client.socket.send_multipart([b"short"])
    client.send("step", {"ok": True})
    _, kind, meta, _ = server.recv(timeout_ms=2000)
    assert (kind, meta, server.dropped) == ("step", {"ok": True}, 2)
