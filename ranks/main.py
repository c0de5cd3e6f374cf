"""The rank process: `python -m radiance.ranks.main`, started by radiance-launch with its rank,
world size, the coordinator's endpoint and the launch's secret in its environment.

Its first acts, before any import that takes time (numpy, zmq and ml_dtypes take seconds on a slow
machine), are to make SIGTERM a clean exit and to die with its coordinator: a coordinator killed
while its ranks start takes them at once, and they remove the run folder it could not."""

import atexit
import os
import shutil
import sys

from .lifecycle import die_with_parent, exit_on_sigterm, limit_threads, terminated, watch_parent


def remove_run() -> None:
    """At exit, when this rank ends on SIGTERM (its coordinator died, or is tearing the launch down):
    the run goes, its folder (the socket and the secret) and its segments (the coordinator's rings
    too, if it cannot). Registered before the imports below, so however early the SIGTERM came."""
    if not terminated():
        return
    shutil.rmtree(os.path.dirname(os.environ["RADIANCE_SECRET_FILE"]), ignore_errors=True)
    shm = sys.modules.get("radiance.collectives.shm")  # no segment exists before it is imported
    if shm is not None:
        shm.unlink_run(os.environ["RADIANCE_RUN_ID"])


if __name__ == "__main__":
    exit_on_sigterm()
    atexit.register(remove_run)
    die_with_parent(int(os.environ.get("RADIANCE_COORDINATOR_PID", os.getppid())))
    watch_parent(int(os.environ.get("RADIANCE_COORDINATOR_PID", os.getppid())), remove_run)

import json  # noqa: E402  (the imports that take time come after the lines above, on purpose)
import logging  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import zmq  # noqa: E402

from radiance.collectives.curve import LaunchKeys, client  # noqa: E402
from radiance.collectives.wire import Wire  # noqa: E402
from radiance.config import Config  # noqa: E402
from radiance.log import get_logger  # noqa: E402

from .session import RankSession  # noqa: E402

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
        context.term()  # then, at exit, remove_run


if __name__ == "__main__":
    sys.exit(main())
