"""The rank process: `python -m radiance.ranks.main`, started by radiance-launch with its rank,
world size, the coordinator's endpoint and the launch's secret in its environment."""

import json
import logging
import os
import shutil
import sys
import threading
import time
import traceback

import zmq

from radiance.collectives.curve import LaunchKeys, client
from radiance.collectives.shm import unlink_run
from radiance.collectives.wire import Wire
from radiance.config import Config
from radiance.log import get_logger

from .lifecycle import die_with_parent, exit_on_sigterm, limit_threads, terminated
from .session import RankSession

HEARTBEAT_SECONDS = 0.5
log = get_logger("radiance.rank")


def _socket(context: zmq.Context, keys) -> zmq.Socket:
    """A DEALER to the coordinator: a CURVE client where the launch spans nodes (`keys`)."""
    socket = context.socket(zmq.DEALER)
    return client(socket, keys) if keys is not None else socket


def _heartbeat(context: zmq.Context, endpoint: str, secret: bytes, rank: int, stop: threading.Event, keys) -> None:
    socket = _socket(context, keys)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    wire = Wire(socket, secret)
    while not stop.wait(HEARTBEAT_SECONDS):
        wire.send("heartbeat", {"rank": rank})
    socket.close(0)


def main() -> int:
    die_with_parent(int(os.environ.get("RADIANCE_COORDINATOR_PID", os.getppid())))
    exit_on_sigterm()
    limit_threads()
    rank, world = int(os.environ["RADIANCE_RANK"]), int(os.environ["RADIANCE_WORLD_SIZE"])
    endpoint = os.environ["RADIANCE_COORDINATOR"]
    with open(os.environ["RADIANCE_SECRET_FILE"], "rb") as handle:
        secret = handle.read()
    keys = LaunchKeys.read(os.environ["RADIANCE_KEYS"]) if os.environ.get("RADIANCE_KEYS") else None
    context = zmq.Context()
    socket = _socket(context, keys)
    socket.setsockopt(zmq.LINGER, 1000)
    socket.connect(endpoint)
    wire = Wire(socket, secret)
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(context, endpoint, secret, rank, stop, keys), daemon=True).start()
    config = Config(**json.loads(os.environ["RADIANCE_CONFIG"]))  # the coordinator's, field for field
    session = RankSession(wire, rank, world, os.environ["RADIANCE_RUN_ID"], config, secret, keys,
                          remote=os.environ.get("RADIANCE_REMOTE") == "1",
                          address=os.environ.get("RADIANCE_NODE_ADDR", "127.0.0.1"))
    try:
        session.run()
        return 0
    except Exception as error:  # reported to the coordinator, which ends the launch
        lines = traceback.format_exc().strip().splitlines()
        log.error("%s: %s", type(error).__name__, error)
        wire.send("error", {"error": f"{type(error).__name__}: {error}", "trace": lines[-6:]})
        time.sleep(0.2)
        return 1
    finally:
        stop.set()
        logging.raiseExceptions = False  # an orphan's stderr pipe may be gone: never fail cleanup on a log line
        session.close()
        socket.close(linger=500)
        context.term()
        if terminated():  # the coordinator died, or is tearing the launch down: either way the run goes
            shutil.rmtree(os.path.dirname(os.environ["RADIANCE_SECRET_FILE"]), ignore_errors=True)
            unlink_run(os.environ["RADIANCE_RUN_ID"])  # the coordinator's plans ring too, if it cannot


if __name__ == "__main__":
    sys.exit(main())
