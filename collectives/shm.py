"""POSIX shared-memory segments of one run, as files in /dev/shm opened and mapped directly.

Why not `multiprocessing.shared_memory`: on Python 3.11 every SharedMemory, created *or attached*,
is registered with the process's resource_tracker, which unlinks it (and warns of a leak) when that
process exits, even though the segment belongs to the run, not to the process. Opening the file in
/dev/shm with os.open and mapping it with mmap involves no tracker at all; the run's owner (each rank
for its own segments, the supervisor for everything of a run) unlinks explicitly.

Names: `rad.<run_id>.<kind>.<rank>` (the file /dev/shm/rad.<run_id>.<kind>.<rank>). A run id is
letters, digits, `_` and `-` only (no `.`), so `unlink_run(run_id)` removes exactly that run's
segments and never another run's whose id merely starts the same way.

Space: /dev/shm is a tmpfs, and a page of it is allocated only when first touched, so a segment
larger than what is free fails late, with SIGBUS in whichever process touches the page. `create`
therefore checks os.statvfs first ("too little /dev/shm: need X MiB, Y MiB free") and reserves the
pages with posix_fallocate, so running out is an error at creation, never a signal later.
"""

from __future__ import annotations

import errno
import mmap
import os
import re
import secrets
from pathlib import Path

import numpy as np

SHM_DIR = Path("/dev/shm")
PREFIX = "rad"
PAGE = mmap.PAGESIZE
MIB = 1 << 20
_RUN_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_KIND = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


class ShmSpaceError(OSError):
    """/dev/shm has too little free space for a segment (or a run's segments)."""


def new_run_id() -> str:
    """A fresh run id: the creating process's pid and 32 random bits."""
    return f"{os.getpid()}_{secrets.token_hex(4)}"


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ValueError(f"run id {run_id!r}: use 1 to 80 of letters, digits, '_' and '-'")
    return run_id


def segment_name(run_id: str, kind: str, rank: int) -> str:
    check_run_id(run_id)
    if not _KIND.match(kind):
        raise ValueError(f"segment kind {kind!r}: lower-case letters, digits and '_'")
    return f"{PREFIX}.{run_id}.{kind}.{int(rank)}"


def round_up(value: int, multiple: int) -> int:
    return -(-int(value) // multiple) * multiple


def shm_free_bytes(directory: Path | str = SHM_DIR) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def check_space(nbytes: int, what: str = "", directory: Path | str = SHM_DIR) -> None:
    """Raise ShmSpaceError unless `nbytes` fit in the free space of /dev/shm."""
    free = shm_free_bytes(directory)
    if nbytes > free:
        suffix = f" ({what})" if what else ""
        raise ShmSpaceError(errno.ENOSPC, f"too little {directory}: need {nbytes / MIB:.1f} MiB, "
                                          f"{free / MIB:.1f} MiB free{suffix}")


class Segment:
    """One mapped segment. `array` is a uint8 numpy view of all of it; views taken from it stay valid
    until `close()`, which unmaps only once no view is left (otherwise the mapping lives until the
    last view is dropped; the name is what `unlink` removes)."""

    def __init__(self, name: str, size: int, mapping: mmap.mmap, owner: bool, directory: Path):
        self.name, self.size, self.owner = name, size, owner
        self.path = directory / name
        self._mmap = mapping
        self.array = np.frombuffer(mapping, dtype=np.uint8, count=size)

    @classmethod
    def create(cls, run_id: str, kind: str, rank: int, size: int, directory: Path | str = SHM_DIR,
               init=None) -> "Segment":
        """Create, size and reserve a new segment (zero-filled; `init(array)` may fill it), then
        publish its name: it is built under a temporary name and linked into place, so a process
        that attaches never sees it half made. Refuses an existing name (FileExistsError)."""
        directory = Path(directory)
        name = segment_name(run_id, kind, rank)
        size = round_up(max(int(size), 1), PAGE)
        check_space(size, name, directory)
        path, building = directory / name, directory / f"{name}.{os.getpid()}.{secrets.token_hex(3)}.new"
        if path.exists():
            raise FileExistsError(errno.EEXIST, f"shared-memory segment {name} exists already", str(path))
        fd = os.open(building, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as error:
                if error.errno == errno.ENOSPC:
                    free = shm_free_bytes(directory)
                    raise ShmSpaceError(errno.ENOSPC, f"too little {directory}: need {size / MIB:.1f} MiB, "
                                                      f"{free / MIB:.1f} MiB free ({name})") from None
                if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                    raise
                os.ftruncate(fd, size)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            segment = cls(name, size, mapping, True, directory)
            if init is not None:
                init(segment.array)
            os.link(building, path)  # atomic, and refuses an existing name
        except BaseException:
            os.close(fd)
            _unlink_path(building)
            raise
        os.close(fd)
        _unlink_path(building)
        return segment

    @classmethod
    def attach(cls, run_id: str, kind: str, rank: int, directory: Path | str = SHM_DIR) -> "Segment":
        """Map an existing segment another process created."""
        directory = Path(directory)
        name = segment_name(run_id, kind, rank)
        try:
            fd = os.open(directory / name, os.O_RDWR)
        except FileNotFoundError:
            message = f"shared-memory segment {name} (rank {rank}'s {kind}) does not exist: " \
                      f"has rank {rank} created it yet?"
            raise FileNotFoundError(errno.ENOENT, message, str(directory / name)) from None
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        return cls(name, size, mapping, False, directory)

    def words(self, offset: int, count: int, stride: int = 64) -> np.ndarray:
        """`count` uint64 words starting at byte `offset`, `stride` bytes apart (a cache line by
        default, so two ranks' words never share a line). word i is `result[i:i+1]`."""
        if offset % 8 or stride % 8 or offset + (count - 1) * stride + 8 > self.size:
            raise ValueError(f"words at {offset} x{count} stride {stride} do not fit {self.name} ({self.size} bytes)")
        return np.ndarray((count,), dtype=np.uint64, buffer=self._mmap, offset=offset, strides=(stride,))

    def close(self) -> None:
        """Unmap. If numpy views are still alive the mapping stays until they are dropped."""
        self.array = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # views alive: the mapping goes with the last of them
            self._mmap = None

    def unlink(self) -> None:
        _unlink_path(self.path)

    def __repr__(self) -> str:
        return f"Segment({self.name!r}, {self.size} bytes, {'owner' if self.owner else 'attached'})"


def _unlink_path(path: Path) -> bool:
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def stage_run_id(run_id: str, stage: int) -> str:
    """The run id a pipeline stage's TP peers name their segments by (their ranks count from 0 in
    every stage); list_run and unlink_run count them the run's."""
    return f"{check_run_id(run_id)}_s{int(stage)}"


def list_run(run_id: str, directory: Path | str = SHM_DIR) -> list[str]:
    """The names of the run's segments that exist now, its stages' (stage_run_id) among them."""
    check_run_id(run_id)
    paths = [*Path(directory).glob(f"{PREFIX}.{run_id}.*"), *Path(directory).glob(f"{PREFIX}.{run_id}_s*.*")]
    return sorted(p.name for p in paths)


def unlink_run(run_id: str, directory: Path | str = SHM_DIR) -> list[str]:
    """Unlink every segment of the run (the supervisor's teardown); returns the names removed.
    Processes that still map a segment keep their mapping; the memory goes with the last of them."""
    return [name for name in list_run(run_id, directory) if _unlink_path(Path(directory) / name)]
