"""Messages between the coordinator and the ranks: zmq multipart frames
[mac, kind, meta (JSON), *array buffers], the mac an HMAC-SHA256 over everything after it under
the launch's secret. A message without a valid mac is dropped and counted, never decoded; and the
time one recv spends on them is bounded (DROP_SECONDS), so a flood of them on a socket others can
reach does not keep its owner from everything else."""

import hashlib
import hmac
import json
import time

import numpy as np
import zmq

MAC_BYTES = 32  # HMAC-SHA256
DROP_SECONDS = 0.002  # what one recv with a timeout spends on unauthenticated messages before it returns None


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
        """(route, kind, meta, arrays), or None on timeout. Unauthenticated messages are skipped;
        with a timeout, once they took DROP_SECONDS this returns None as if nothing had come (the
        caller's other duties come first; the rest of the flood waits in zmq's bounded queue)."""
        give_up = None
        while True:
            if timeout_ms is not None and not self.socket.poll(timeout_ms):
                return None
            frames = self.socket.recv_multipart()
            route, frames = (frames[:1], frames[1:]) if routed else ([], frames)
            if (len(frames) < 3 or len(frames[0]) != MAC_BYTES  # no mac computed for what cannot carry one
                    or not hmac.compare_digest(frames[0], self._mac(frames[1:]))):
                self.dropped += 1
                if timeout_ms is not None:
                    now = time.monotonic()
                    give_up = give_up or now + DROP_SECONDS
                    if now >= give_up:
                        return None
                continue
            kind, header = frames[1].decode(), json.loads(frames[2])
            arrays = {name: np.frombuffer(buffer, dtype=np.dtype(dtype)).reshape(shape)
                      for (name, (dtype, shape)), buffer in zip(header["arrays"].items(), frames[3:])}
            return route, kind, header["meta"], arrays
