"""The steps of a rank on another node than the coordinator's: the plans ring and the results ring
are shared memory on the coordinator's node, so there each record comes as a signed zmq message
over the rank's own CURVE connection instead (kind "plan", the record's bytes as they would lie in
the ring), and the answering rank's results go back the same way (kind "result"). The records are
the rings' (generation/plan_record.py, collectives/ring_record.py), so a rank reads and writes them
alike either way."""

import numpy as np

from radiance.collectives.wire import Wire

SLICE_MS = 200  # a signal (SIGTERM from the agent) is taken between slices of the wait


class WirePlans:
    def __init__(self, wire: Wire):
        self.wire = wire

    def read(self) -> bytes:
        while True:
            message = self.wire.recv(timeout_ms=SLICE_MS)
            if message is None:
                continue
            _, kind, _, arrays = message
            if kind != "plan":
                raise RuntimeError(f"expected a plan from the coordinator, got '{kind}'")
            return arrays["record"].tobytes()

    def close(self) -> None:
        pass


class WireResults:
    def __init__(self, wire: Wire):
        self.wire = wire

    def publish(self, payload: bytes) -> None:
        self.wire.send("result", arrays={"record": np.frombuffer(payload, np.uint8)})

    def close(self) -> None:
        pass
