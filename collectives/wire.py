"""Messages between the coordinator and the ranks: zmq multipart frames
[mac, kind, meta (JSON), *array buffers], the mac an HMAC-SHA256 over everything after it under
the launch's secret. A message without a valid mac is dropped and counted, never decoded."""

import hashlib
import hmac
import json

import numpy as np
import zmq


class Wire:
    def __init__(self, socket: zmq.Socket, secret: bytes):
        self.socket, self.secret = socket, secret
        self.dropped = 0  # unauthenticated messages seen

    def _mac(self, frames) -> bytes:
        mac = hmac.new(self.secret, digestmod=hashlib.sha256)
        for frame in frames:
            mac.update(len(frame).to_bytes(8, "little"))
            mac.update(frame)
        return mac.digest()

    def send(self, kind: str, meta: dict | None = None, arrays: dict | None = None, route: list | None = None) -> None:
        arrays = arrays or {}
        described = {name: [str(a.dtype), list(a.shape)] for name, a in arrays.items()}
        frames = [kind.encode(), json.dumps({"meta": meta or {}, "arrays": described}).encode()]
        frames += [np.ascontiguousarray(a).tobytes() for a in arrays.values()]
        self.socket.send_multipart([*(route or []), self._mac(frames), *frames])

    def recv(self, timeout_ms: int | None = None, routed: bool = False):
        """(route, kind, meta, arrays), or None on timeout. Unauthenticated messages are skipped."""
        while True:
            if timeout_ms is not None and not self.socket.poll(timeout_ms):
                return None
            frames = self.socket.recv_multipart()
            route, frames = (frames[:1], frames[1:]) if routed else ([], frames)
            if len(frames) < 3 or not hmac.compare_digest(frames[0], self._mac(frames[1:])):
                self.dropped += 1
                continue
            kind, header = frames[1].decode(), json.loads(frames[2])
            arrays = {name: np.frombuffer(buffer, dtype=np.dtype(dtype)).reshape(shape)
                      for (name, (dtype, shape)), buffer in zip(header["arrays"].items(), frames[3:])}
            return route, kind, header["meta"], arrays
