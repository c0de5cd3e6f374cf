"""A rank's life: it dies with its coordinator (the parent-death signal), turns SIGTERM into a
clean exit that runs its cleanups, and limits its compute threads to its share of the cores."""

import ctypes
import os
import signal
import sys

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
