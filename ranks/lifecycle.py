"""A rank's life: it dies with its coordinator (the parent-death signal, and a thread that watches
the parent), turns SIGTERM into a clean exit that runs its cleanups, and limits its compute threads
to its share of the cores."""

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1
_terminated: list = []


def terminated() -> bool:
    """Whether this rank is ending on SIGTERM: its coordinator died (the parent-death signal;
    the parent may not be reaped yet, so getppid cannot tell) or is tearing the launch down."""
    return bool(_terminated)


def die_with_parent(coordinator_pid: int) -> None:
    """SIGTERM this process when the coordinator dies, however it dies (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
    if os.getppid() != coordinator_pid:  # it died before the prctl took hold
        os.kill(os.getpid(), signal.SIGTERM)


def watch_parent(parent_pid: int, cleanup, interval: float = 0.5, grace: float = 2.0) -> None:
    """End this process at most `interval` + `grace` seconds after its parent's death, whatever its
    main thread is doing: `cleanup()`, then os._exit. The parent-death signal's SIGTERM becomes a
    SystemExit in the main thread, and an import's broad `except` can swallow it (a rank was found
    alive 37 minutes after its coordinator died, SIGTERM already ignored, waiting for a reply that
    would never come). `grace` leaves the SIGTERM path its own cleanup first, where it runs: the
    process then exits by itself, and this daemon thread with it."""
    def watch():
        while os.getppid() == parent_pid:
            time.sleep(interval)
        time.sleep(grace)
        _terminated.append(signal.SIGTERM)
        try:
            cleanup()
        finally:
            os._exit(128 + signal.SIGTERM)

    threading.Thread(target=watch, name="parent watch", daemon=True).start()


def exit_on_sigterm() -> None:
    """SIGTERM exits cleanly; SIGINT is the coordinator's to handle (Ctrl-C reaches the whole
    process group, and a rank must not die of it before the coordinator stops the launch)."""
    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: let the cleanup finish
        _terminated.append(signum)
        sys.exit(128 + signum)  # unwinds: finally blocks and atexit handlers run

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def limit_threads() -> None:
    threads = int(os.environ.get("RADIANCE_THREADS", "0") or 0)
    if threads > 0:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
