"""The coordinator's end of the steps of ranks on other nodes (ranks/wire_steps.py is theirs): a
plan goes to each of them as a signed "plan" message on their own connection, beside the plans
ring of this node's ranks; where the answering rank is on another node its results come back as
"result" messages, which the coordinator's watch (look_after) queues here as it takes zmq's
messages, and `read` waits for, as a RingReader's read does."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from radiance.collectives.ring import RingTimeout


class RemoteSteps:
    def __init__(self, ranks: list[int], send: Callable[[int, str, dict, dict], None], answers: bool,
                 wait: Callable[[int], object]):
        """`ranks`: those on other nodes; `send(rank, kind, meta, arrays)`; `answers`: the answering
        rank is one of them; `wait(ms)`: until zmq has something (or ms pass)."""
        self.ranks, self.send, self.answers, self.wait = ranks, send, answers, wait
        self.queue: deque = deque()

    def publish(self, payload: bytes) -> None:
        record = np.frombuffer(payload, np.uint8)
        for rank in self.ranks:
            self.send(rank, "plan", None, {"record": record})

    def arrived(self, payload: bytes) -> None:
        self.queue.append(payload)

    def read(self, timeout: float | None = None, check: Callable[[], None] | None = None, **waits) -> bytes:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if check is not None:
                check()  # takes zmq's messages: a result lands in the queue
            if self.queue:
                return self.queue.popleft()
            if deadline is not None and time.monotonic() > deadline:
                raise RingTimeout("the answering rank's result did not come")
            self.wait(20)

    def close(self) -> None:
        self.queue.clear()
