"""Node 0's front to the other nodes: the launch's keys (made here, written to --keys for the other
nodes to read), the coordinator's socket made a CURVE server and bound on --master-addr
--master-port (and nowhere else on the network: this node's own ranks come in through the run
folder's ipc:// endpoint), the ZAP handler that admits only the launch's client key, and the
agents that join (nodes.py)."""

from __future__ import annotations

from pathlib import Path

import zmq

from radiance.collectives.curve import Guard, LaunchKeys, serve
from radiance.config import Config
from radiance.log import get_logger

from .nodes import Nodes
from .placement import resolve_address

log = get_logger("radiance.launch")


class Front:
    def __init__(self, config: Config, context: zmq.Context):
        self.config, self.path = config, Path(config.keys)
        self.address = resolve_address(config.master_addr)
        self.keys = LaunchKeys.make()
        self.keys.write(self.path)  # refuses an old file: a launch's keys are its own
        self.guard = Guard(context, self.keys)
        self.nodes: Nodes | None = None
        log.info("keys for this launch written to %s: the other %d node%s read it there (a shared folder) or "
                 "from a copy", self.path, config.nnodes - 1, "" if config.nnodes == 2 else "s")

    def bind(self, socket: zmq.Socket) -> None:
        serve(socket, self.keys)
        endpoint = f"tcp://{self.address}:{self.config.master_port}"
        try:
            socket.bind(endpoint)
        except zmq.ZMQError as error:
            raise OSError(f"--master-addr {self.config.master_addr} --master-port {self.config.master_port}: "
                          f"cannot bind {endpoint} ({error})") from None
        self.nodes = Nodes(self.config, self._send)
        log.info("waiting for %d node%s at %s", self.config.nnodes - 1, "" if self.config.nnodes == 2 else "s",
                 endpoint)

    wire = None  # the coordinator's, once it is made (attach_wire)

    def attach_wire(self, wire) -> None:
        self.wire = wire

    def _send(self, route: bytes, kind: str, meta: dict) -> None:
        self.wire.send(kind, meta, route=[route])

    def rank_environment(self) -> dict:
        """What this node's ranks need: the keys (their sockets are CURVE clients too) and the
        address a stage boundary from another host binds on."""
        return {"RADIANCE_KEYS": str(self.path), "RADIANCE_NODE_ADDR": self.address}

    def close(self) -> None:
        if self.guard.refused:
            log.warning("refused %d connection%s without the launch's key", self.guard.refused,
                        "" if self.guard.refused == 1 else "s")
        self.guard.close()
        self.path.unlink(missing_ok=True)
