"""The writer's `.partial` files and who is writing them. A writer holds an exclusive lock (flock) on
its partial file for as long as it writes; the kernel drops the lock when the process ends, however
it ends, so a partial file whose lock can be taken was left by a writer that died (SIGKILL, a power
cut) and can go. `sweep` removes those in a folder; a live writer's file is never touched, and
neither is a file that is not a container being written (a `.partial` of someone else's)."""

import fcntl
import os
from pathlib import Path

from .container_format import ContainerError, LENGTH_BYTES

SUFFIX = ".partial"
# Every container starts its header this way (container_format.encode_header's first key).
HEADER_START = b'{"__metadata__":{"radiance"'


def open_partial(path: str) -> int:
    """A descriptor on `path` (created, emptied), locked for this writer; ContainerError when another
    live writer holds it (two conversions to one file)."""
    while True:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ContainerError(f"{path}: another process is writing it now; wait for it, or write elsewhere") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # a sweep removed the file between the open and the lock: open it afresh
    os.ftruncate(fd, 0)
    return fd


def _is_container(path: Path) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(LENGTH_BYTES + len(HEADER_START))[LENGTH_BYTES:] == HEADER_START
    except OSError:
        return False


def _remove_if_abandoned(path: Path) -> bool:
    """Remove `path` if no process holds the writer's lock on it; the lock is held while it goes,
    so a writer that opens the path meanwhile finds it gone and makes it afresh (open_partial)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink()
        return True
    except (BlockingIOError, FileNotFoundError):
        return False
    finally:
        os.close(fd)


def sweep(folder) -> list[Path]:
    """Remove the partial containers in `folder` whose writers are gone; the paths removed."""
    removed = []
    try:
        candidates = sorted(Path(folder).glob(f"*{SUFFIX}"))
    except OSError:
        return removed
    for path in candidates:
        if path.is_file() and _is_container(path) and _remove_if_abandoned(path):
            removed.append(path)
    return removed
