"""What the server asks of the ranks behind its Engine, for one rank in process (a Worker) or a
launch (its Coordinator): how to wait while idle, each step's figures for /metrics, and the graph
for /graph. Only the engine thread calls `idle` and `step_stats`."""

import threading

from .graph import declared_nodes, open_declared

IDLE_SECONDS = 0.2  # a launch's heartbeats are taken at least this often while idle


class WorkerSource:
    """TP 1: the Worker runs in this process."""

    world = 1

    def __init__(self, worker):
        self.worker = worker
        self.digest = worker.digest
        self.lines = list(worker.lines)
        self._declared = declared_nodes(worker.model.graph)

    def idle(self, wake: threading.Event) -> None:
        wake.wait(1.0)

    def step_stats(self, execute_seconds: float) -> dict:
        holds = self.worker.link.hold_stats()
        return {"compute": execute_seconds, "collectives": 0.0, "gate_holds": holds["holds"],
                "gate_hold_s": holds["total_s"]}

    def declared(self) -> list[dict]:
        return self._declared


class LaunchSource:
    """TP N: the coordinator of radiance-launch; rank 0 reports each step's figures and its graph
    came with the handshake."""

    def __init__(self, coordinator, engine_options):
        self.coordinator, self.options = coordinator, engine_options
        self.world = coordinator.world
        self.digest = coordinator.digest
        self.lines = list(getattr(coordinator, "lines", []))
        self._declared = None
        self._lock = threading.Lock()

    def idle(self, wake: threading.Event) -> None:
        wake.wait(IDLE_SECONDS)
        self.coordinator.idle()

    def step_stats(self, execute_seconds: float) -> dict:
        return dict(getattr(self.coordinator, "last_step", None) or {})

    def declared(self) -> list[dict]:
        with self._lock:
            if self._declared is None:
                options = self.options
                self._declared = open_declared(options.model, options.radiance_home, options.kernels,
                                               {"activation_dtype": options.activation_dtype,
                                                "block_size": options.block_size})
            return self._declared
