"""A pipeline stage boundary between hosts: the engine's transport behind `RadPeers.link`, zmq over
TCP with CURVE (curve.py), every message signed (wire.py). The receiving rank binds a PULL socket
on its node's address (an ephemeral port, told to the sender through the handshake); the sending
rank connects a PUSH socket. A message is one send row's rows and its epoch; the receiver takes
them in order and refuses any other epoch or size (the two ends launch the same sequence)."""

from __future__ import annotations

import os
import time

import numpy as np
import zmq

from radiance.abi import RAD_E_DEVICE, RAD_E_SHAPE, RAD_OK, RadLink, RadPeers

from .curve import LaunchKeys, client, serve
from .wire import Wire

# How long a recv waits for its rows before its row fails (supervision ends a launch with a dead
# peer long before); the wait is taken in slices so a signal is handled between them.
WAIT_TIMEOUT_S = float(os.environ.get("RADIANCE_COLLECTIVE_TIMEOUT_S", "120"))
SLICE_MS = 100


class LinkEnd:
    """One end of a boundary's link; `peers` is what the send or recv row gets."""

    def __init__(self, socket: zmq.Socket, secret: bytes, sender: bool):
        self.socket, self.wire, self.sender = socket, Wire(socket, secret), sender
        self.epoch = 0
        link = RadLink(ctx=self, send=self.send if sender else None, recv=None if sender else self.recv)
        self.peers = RadPeers(rank=0 if sender else 1, world_size=2, epoch=0, link=link)

    @classmethod
    def bind(cls, context: zmq.Context, keys: LaunchKeys, address: str) -> "LinkEnd":
        """The receiving end, on `address` (its node's); `endpoint` is where the sender connects."""
        socket = serve(context.socket(zmq.PULL), keys)
        socket.setsockopt(zmq.LINGER, 0)
        socket.bind(f"tcp://{address}:*")
        return cls(socket, keys.signing, sender=False)

    @classmethod
    def connect(cls, context: zmq.Context, keys: LaunchKeys, endpoint: str) -> "LinkEnd":
        socket = client(context.socket(zmq.PUSH), keys)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(endpoint)
        return cls(socket, keys.signing, sender=True)

    @property
    def endpoint(self) -> str:
        return self.socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def send(self, rows: np.ndarray) -> int:
        self.epoch += 1
        self.wire.send("rows", {"epoch": self.epoch}, {"rows": rows})
        return RAD_OK

    def recv(self, rows: np.ndarray) -> int:
        self.epoch += 1
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while True:
            message = self.wire.recv(timeout_ms=SLICE_MS)
            if message is not None:
                break
            if time.monotonic() > deadline:
                return RAD_E_DEVICE
        _, kind, meta, arrays = message
        got = arrays.get("rows")
        if kind != "rows" or meta.get("epoch") != self.epoch:
            return RAD_E_DEVICE
        if got is None or got.shape != rows.shape or got.dtype != rows.dtype:
            return RAD_E_SHAPE
        np.copyto(rows, got)
        return RAD_OK

    def close(self) -> None:
        self.socket.close(0)
