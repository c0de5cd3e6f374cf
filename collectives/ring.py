"""A broadcast ring in shared memory: one writer (the process that creates it), `readers` readers,
every reader reads every record, in the order written. The launch's step plans go through one
(coordinator -> every rank) and rank 0's results through another (rank 0 -> coordinator), so a step
costs no zmq round trip; zmq keeps the handshake, errors and heartbeats (docs/RUNTIME.md).

The segment `rad.<run>.<kind>.0` (collectives/shm.py: created 0600 in /dev/shm, built under a
temporary name and linked into place, refusing a name that exists):

    control, one page; 64-byte lines, so no two processes write the same line:
      line 0      magic, readers, slots, slot bytes, the writer's pid
      line 1      published: u64, records written so far (record k, from 1, is in slot (k - 1) % slots)
      line 2      signal: u32, published mod 2**32, the futex word readers sleep on
      line 3 + i  reader i: consumed u64 (records it is done with), its pid u64, sleeping u64 (1 while
                  it may be on the futex: the writer wakes only then)
    `slots` slots of `slot_bytes` bytes each, a slot being
      [ mac: 32 B ][ seq: u64 ][ length: u64 ][ 16 B pad ][ payload: length bytes ]

Invariants. Only the writer writes `published`, `signal` and the slots; only reader i writes line
3 + i. The writer fills slot (k - 1) % slots with record k only once every reader's consumed is at
least k - slots, so no one still reads the record k - slots it replaces. A reader copies a record
out, checks its mac and seq on the copy, and only then stores consumed = k. The writer stores the
slot, then `published`, then `signal`, then wakes if a reader says it sleeps; x86-64 keeps stores
in that order for the readers (TSO), as the host collectives' flags rely on too. The wake is skipped
when no reader sleeps (a reader spinning for the record, as a rank does, costs the writer no system
call): a reader stores sleeping = 1, then reads `signal` and `published`; the writer stores
`published` and `signal`, then reads the sleeping words. TSO lets each side's load pass its own
store, so both sides put a full fence between them (`_fence`: a locked instruction, through an
uncontended lock), and one of the two always sees the other: the reader its record, or the writer
its sleeper.

The slots are copied through a memoryview of the mapping, not numpy: on caches a decode step has
flushed, each numpy call costs some 50 us here, a memoryview slice 20 (bench/ring_latency.py). Where
libr4d has offered its r4d_ring.c (abi/host_helpers.py), a reader made after that takes a record
into a buffer of its own (`take`) in one C call instead: `published` looked at, the same copy and
the same checks, `consumed` stored, and, given a table, the copies out of the payload and a feed
(a rank's plan into its step inputs: generation/plan_record.py). The call's arguments are u64 words
the reader keeps (its TAKE_* words; `next`, the record to take, is one of them on either way of
reading, since the C call advances it).

The mac: keyed BLAKE2b (BLAKE2's own MAC mode, 32 bytes) under the launch's secret over everything
after it (seq, length, payload). The segment is already the owner's alone (0600, in sticky
/dev/shm; `attach` refuses one that is not this user's or that others may open), so the mac is not
what keeps another user out: it makes a record that is torn (a writer that broke the invariant),
stale (seq) or written by anything but the launch's writer fail loudly instead of running a wrong
step. It costs about 2 us for a decode plan here (bench/ring_latency.py; HMAC-SHA256 about 3), paid
by the writer and each reader, against a step of milliseconds.

Waiting. A reader spins up to `spin_s` (1 ms: about what the coordinator takes to make the next
plan), giving its core to any runnable process every 16 reads, then sleeps on the signal word
(collectives/futex.py) in slices of `slice_s`, calling the caller's `check` between slices and
giving up when the writer's process is gone. Why spin at all: waking a sleeping process costs tens
of microseconds here (a VM wakes an idle virtual CPU), a plan's whole budget. A reader that knows
the record cannot come before `expect_s` (the coordinator, for a step as long as the last of its
shape) sleeps until then first, then spins: it takes no core while the ranks compute. A writer that
finds no free slot waits with rad_backoff's pauses and names the reader it waits for, and a reader
whose process is gone ends the wait at once.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import os
import stat
import struct
import threading
import time
from collections.abc import Callable

import numpy as np

from radiance.abi import host_helpers, rad_backoff

from . import futex
from .shm import PAGE, SHM_DIR, Segment, round_up, segment_name

MAGIC = b"RADRING1"
LINE = 64
_HEADER = struct.Struct("<8sIIQQ")  # magic, readers, slots, slot_bytes, writer pid
PUBLISHED_OFF, SIGNAL_OFF, READERS_OFF = LINE, 2 * LINE, 3 * LINE
_SEQ_LENGTH = struct.Struct("<QQ")  # a slot's seq and length, after its mac
SLOT_HEADER = 64  # mac 32 | seq 8 | length 8 | pad 16
MAC_BYTES = 32
MAX_READERS = (PAGE - READERS_OFF) // LINE
CHECK_SECONDS = 0.01  # how often a waiting writer looks at its readers' processes
SPIN_SECONDS = 1e-3  # what a rank waits for the next plan while the coordinator makes it
SLICE_SECONDS = 0.02
_PUBLISHED, _SIGNAL = PUBLISHED_OFF // 8, SIGNAL_OFF // 4  # their indices among the control page's u64 / u32 words
# r4d_ring_take_p's argument words (r4d_ring.c: TAKE_*), what it made of a table, and its "not yet"
(TAKE_SLOTS, TAKE_SLOT_COUNT, TAKE_SLOT_BYTES, TAKE_PUBLISHED, TAKE_CONSUMED, TAKE_NEXT, TAKE_INTO, TAKE_CAPACITY,
 TAKE_KEY, TAKE_KEY_BYTES, TAKE_TABLE, TAKE_SAMPLED, TAKE_FOUND, TAKE_MADE, TAKE_WORDS) = range(15)
MADE_COPIES, MADE_FED = 1, 2
NOT_PUBLISHED = -5


class RingError(RuntimeError):
    """The ring cannot go on: a record that does not verify, one too large, a bad segment."""


class RingTimeout(RingError, TimeoutError):
    """A wait on the ring passed its deadline; names who was waited for."""


class PeerGone(RingError):
    """The process at the other end of the ring has ended; names it."""


def control_bytes() -> int:
    return PAGE


def ring_bytes(slots: int, slot_bytes: int) -> int:
    return control_bytes() + int(slots) * int(slot_bytes)


def slot_size(record_bytes: int) -> int:
    """A slot that holds a record of `record_bytes` payload bytes, in whole pages."""
    return round_up(SLOT_HEADER + max(int(record_bytes), 1), PAGE)


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    if pid <= 0:
        return True  # not attached yet: nothing to judge
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


class _Ring:
    """What the writer and a reader share: the mapping, its words and its slots."""

    def __init__(self, segment: Segment, secret: bytes, what: str):
        self.segment, self.secret, self.what = segment, bytes(secret), what
        magic, readers, slots, slot_bytes, writer = _HEADER.unpack_from(segment.array[:_HEADER.size].tobytes())
        if magic != MAGIC:
            raise RingError(f"{segment.name} is not a broadcast ring")
        if segment.size < ring_bytes(slots, slot_bytes):
            raise RingError(f"{segment.name} is {segment.size} bytes, short of {ring_bytes(slots, slot_bytes)}")
        self.readers, self.slots, self.slot_bytes, self.writer_pid = readers, slots, slot_bytes, writer
        array = segment.array
        self.published = segment.words(PUBLISHED_OFF, 1)
        self.signal = array[SIGNAL_OFF:SIGNAL_OFF + 4].view(np.uint32)
        self.signal_address = self.signal.ctypes.data
        self.consumed = segment.words(READERS_OFF, readers, LINE)
        self.pids = segment.words(READERS_OFF + 8, readers, LINE)
        self.sleeping = segment.words(READERS_OFF + 16, readers, LINE)
        base = control_bytes()
        self._slots = [array[base + j * slot_bytes:base + (j + 1) * slot_bytes] for j in range(slots)]
        self._offsets = [base + j * slot_bytes for j in range(slots)]
        self._bytes = memoryview(array)  # the whole mapping, for the slots' copies
        self._base = array.ctypes.data  # its address, for r4d_ring.c's
        # libr4d's r4d_ring.c where its plugin has offered it (abi/host_helpers.py), else None: the
        # Python way below makes the same copy and the same checks
        self._take_native = host_helpers.offered("ring_take")
        # The control page's words as a memoryview (u64 and u32): the hot paths read and store them
        # without a numpy call (aligned, so each load and store is one instruction, as numpy's)
        self._words = self._bytes[:PAGE].cast("Q")
        self._words32 = self._bytes[:PAGE].cast("I")
        self._lock = threading.Lock()

    def _fence(self) -> None:
        """A full memory fence: taking an uncontended lock is a locked read-modify-write (x86-64: a
        fence for every earlier store and later load), so a store before it is seen by every other
        core before a load after it reads."""
        with self._lock:
            pass

    @property
    def capacity(self) -> int:
        """The largest payload one record may carry."""
        return self.slot_bytes - SLOT_HEADER

    def slot(self, k: int) -> np.ndarray:
        return self._slots[(k - 1) % self.slots]

    def _mac(self, data) -> bytes:
        return hashlib.blake2b(data, key=self.secret, digest_size=MAC_BYTES).digest()

    def close(self) -> None:
        self._slots, self.published, self.signal, self.consumed, self.pids, self.sleeping = [], None, None, None, \
            None, None
        self._words.release()
        self._words32.release()
        self._bytes.release()
        self.segment.close()


class RingWriter(_Ring):
    """The writing end; made by `create`, which also owns (and at `close`, unlinks) the segment."""

    @classmethod
    def create(cls, run_id: str, kind: str, readers: int, slots: int, record_bytes: int, secret: bytes,
               directory=SHM_DIR) -> "RingWriter":
        if not 1 <= int(readers) <= MAX_READERS:
            raise ValueError(f"a broadcast ring has 1 to {MAX_READERS} readers, not {readers}")
        if int(slots) < 1:
            raise ValueError(f"a broadcast ring needs at least one slot, not {slots}")
        slot_bytes = slot_size(record_bytes)
        header = _HEADER.pack(MAGIC, int(readers), int(slots), slot_bytes, os.getpid())

        def init(array):
            array[:_HEADER.size] = np.frombuffer(header, np.uint8)

        segment = Segment.create(run_id, kind, 0, ring_bytes(slots, slot_bytes), directory, init=init)
        return cls(segment, secret, f"the {kind} ring")

    def __init__(self, segment: Segment, secret: bytes, what: str):
        super().__init__(segment, secret, what)
        self._written = int(self.published[0])  # records written (only this process writes them)
        self._room = 0  # the least of the readers' consumed, as last read
        self._consumed_at = [(READERS_OFF + i * LINE) // 8 for i in range(self.readers)]  # among the u64 words
        # every reader's sleeping word in one unpack (they are a line apart)
        self._sleepers = struct.Struct("<" + f"{LINE - 8}x".join(["Q"] * self.readers))

    def publish(self, payload, *, timeout: float | None = None, check: Callable[[], None] | None = None) -> int:
        """Write one record (`payload`: bytes-like) and wake the readers; its seq. Waits while every
        slot holds a record some reader has not read yet."""
        data = memoryview(payload).cast("B")
        length = data.nbytes
        if length > self.capacity:
            raise RingError(f"{self.what}: a {length}-byte record does not fit its {self.capacity}-byte slots")
        k = self._written + 1
        if k > self.slots and self._room < k - self.slots:  # the readers' progress as last seen first
            words = self._words
            self._room = min([words[i] for i in self._consumed_at])
            if self._room < k - self.slots:
                self._wait_for_room(k - self.slots, timeout, check)
                self._room = k - self.slots
        memory, start = self._bytes, self._offsets[(k - 1) % self.slots]
        memory[start + SLOT_HEADER:start + SLOT_HEADER + length] = data
        _SEQ_LENGTH.pack_into(memory, start + MAC_BYTES, k, length)
        memory[start:start + MAC_BYTES] = self._mac(memory[start + MAC_BYTES:start + SLOT_HEADER + length])
        self._words[_PUBLISHED] = self._written = k
        self._words32[_SIGNAL] = k & 0xFFFFFFFF
        self._fence()
        if any(self._sleepers.unpack_from(memory, READERS_OFF + 16)):
            futex.wake(self.signal_address)
        return k

    def _wait_for_room(self, need: int, timeout: float | None, check) -> None:
        """Until every reader has consumed record `need` (the one the next record replaces)."""
        start = time.monotonic()
        looked = start
        for _ in rad_backoff():
            behind = [i for i in range(self.readers) if int(self.consumed[i]) < need]
            if not behind:
                return
            now = time.monotonic()
            if now - looked >= CHECK_SECONDS:
                looked = now
                for i in behind:
                    if not _alive(int(self.pids[i])):
                        raise PeerGone(f"{self.what}: reader {i} (pid {int(self.pids[i])}) is gone "
                                       f"before reading record {need}")
                if check is not None:
                    check()
            if timeout is not None and now - start > timeout:
                raise RingTimeout(f"{self.what}: reader {behind[0]} has not read record {need} in {timeout:g} s")

    def close(self) -> None:
        """Unmap and unlink (readers keep their mappings until they close)."""
        path = self.segment.path
        super().close()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class RingReader(_Ring):
    """Reader `index` of a ring another process created."""

    def __init__(self, segment: Segment, secret: bytes, what: str, index: int,
                 spin_s: float = SPIN_SECONDS, slice_s: float = SLICE_SECONDS):
        super().__init__(segment, secret, what)
        if not 0 <= index < self.readers:
            raise RingError(f"{what}: reader {index} of a ring of {self.readers} readers")
        self.index, self.spin_ns, self.slice_s = index, int(spin_s * 1e9), slice_s
        self.pids[index] = os.getpid()
        self._consumed = (READERS_OFF + index * LINE) // 8  # its consumed word among the u64 words
        # r4d_ring_take_p's arguments (its TAKE_* words); `next`, the record to take, is kept here
        # on either way of reading, since r4d_ring.c advances it
        self._arguments = memoryview(bytearray(TAKE_WORDS * 8)).cast("Q")
        self._arguments_pointer = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(self._arguments)))
        self._key = ctypes.create_string_buffer(self.secret, len(self.secret))
        self._into = None  # the last `into` taken into (r4d_ring.c)
        arguments, base = self._arguments, self._base
        arguments[TAKE_SLOTS], arguments[TAKE_SLOT_COUNT], arguments[TAKE_SLOT_BYTES] = \
            base + control_bytes(), self.slots, self.slot_bytes
        arguments[TAKE_PUBLISHED], arguments[TAKE_CONSUMED] = base + PUBLISHED_OFF, base + 8 * self._consumed
        arguments[TAKE_NEXT] = int(self.consumed[index]) + 1
        arguments[TAKE_CAPACITY], arguments[TAKE_KEY], arguments[TAKE_KEY_BYTES] = \
            self.capacity, ctypes.addressof(self._key), len(self.secret)

    @classmethod
    def attach(cls, run_id: str, kind: str, index: int, secret: bytes, directory=SHM_DIR, **waits) -> "RingReader":
        """Map the ring as reader `index`; refuses a segment another user owns or may open."""
        name = segment_name(run_id, kind, 0)
        try:
            info = os.stat(os.path.join(directory, name))
        except FileNotFoundError:
            raise RingError(f"the {kind} ring {name} does not exist") from None
        if info.st_uid != os.getuid() or stat.S_IMODE(info.st_mode) & 0o077:
            raise RingError(f"the {kind} ring {name} is not this user's alone "
                            f"(owner {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}): refused")
        return cls(Segment.attach(run_id, kind, 0, directory), secret, f"the {kind} ring", index, **waits)

    @property
    def next(self) -> int:
        """The record this reader takes next (from 1)."""
        return self._arguments[TAKE_NEXT]

    @property
    def native(self) -> bool:
        """Whether this reader takes records with r4d_ring.c (`take`)."""
        return self._take_native is not None

    @property
    def made(self) -> int:
        """What the last `take` made of its table: 0, MADE_COPIES, or MADE_COPIES | MADE_FED."""
        return self._arguments[TAKE_MADE]

    def read(self, timeout: float | None = None, check: Callable[[], None] | None = None, *,
             spin_s: float | None = None, expect_s: float = 0.0, poll_s: float = 0.0,
             into: memoryview | None = None) -> memoryview:
        """The next record's payload (a copy: the slot is free again once this returns).
        `spin_s`: how long to spin before sleeping (the reader's own by default); `expect_s`: the
        record is not expected before this long, so sleep until then first and spin after;
        `poll_s`: sleep in naps of this long instead of on the futex, for a reader that can take
        the record late: then the writer has no one to wake, which would cost it (not the reader)
        about 270 us on this VM (docs/RUNTIME.md, "Run ahead"). `into`: a writable byte view of at
        least `slot_bytes` to copy the record into, its payload then at SLOT_HEADER, valid until
        the next read into it (a rank's plans: generation/plan_record.py); else a new copy."""
        if self._take_native is not None and into is not None:
            length = self.take(into, 0, 0, timeout, check, spin_s=spin_s, expect_s=expect_s, poll_s=poll_s)
            return into[SLOT_HEADER:SLOT_HEADER + length]
        k = self._arguments[TAKE_NEXT]
        if self._words[_PUBLISHED] < k:
            self._wait(k, timeout, check, self.spin_ns if spin_s is None else int(spin_s * 1e9), expect_s, poll_s)
        memory, start = self._bytes, self._offsets[(k - 1) % self.slots]
        _, length = _SEQ_LENGTH.unpack_from(memory, start + MAC_BYTES)
        end = SLOT_HEADER + length
        if end > self.slot_bytes:
            raise RingError(f"{self.what}: record {k} claims {length} bytes, over its {self.capacity}-byte slot")
        if into is None:
            view = memoryview(bytes(memory[start:start + end]))  # checked and used as copied
        else:
            into[:end] = memory[start:start + end]
            view = into[:end]
        seq, copied = _SEQ_LENGTH.unpack_from(view, MAC_BYTES)
        mac = hashlib.blake2b(view[MAC_BYTES:], key=self.secret, digest_size=MAC_BYTES).digest()  # _mac, inline
        if not hmac.compare_digest(view[:MAC_BYTES], mac) or copied != length:
            raise RingError(f"{self.what}: record {k} does not verify under the launch's secret (forged or torn)")
        if seq != k:
            raise RingError(f"{self.what}: slot of record {k} holds record {seq}")
        self._arguments[TAKE_NEXT] = k + 1
        self._words[self._consumed] = k
        return view[SLOT_HEADER:]

    def take(self, into: memoryview, table: int = 0, sampled: int = 0, timeout: float | None = None,
             check: Callable[[], None] | None = None, **waits) -> int:
        """read() into `into` in one call of r4d_ring.c's (only where `native`: the same copy, the
        same checks, the same refusals); the payload's length, the payload at SLOT_HEADER of `into`.
        `table`: the address of a table of copies out of the payload, and of the feed, that the
        call makes once the record verifies, if the payload begins as the table says
        (r4d_ring_take_p, generation/plan_record.py; `sampled`: the tokens the feed's sources are
        below); `made` says what it made. `waits`: read()'s."""
        arguments = self._arguments
        if into is not self._into:
            if len(into) < self.slot_bytes:
                raise RingError(f"{self.what}: a {len(into)}-byte buffer to read {self.slot_bytes}-byte slots into")
            self._into = into
            arguments[TAKE_INTO] = ctypes.addressof(ctypes.c_char.from_buffer(into))
        arguments[TAKE_TABLE], arguments[TAKE_SAMPLED] = table, sampled
        length = self._take_native(self._arguments_pointer)
        if length == NOT_PUBLISHED:  # wait in Python (its checks between slices), then take it
            spin_s = waits.pop("spin_s", None)
            self._wait(arguments[TAKE_NEXT], timeout, check, self.spin_ns if spin_s is None else int(spin_s * 1e9),
                       waits.get("expect_s", 0.0), waits.get("poll_s", 0.0))
            length = self._take_native(self._arguments_pointer)
        if length < 0:
            raise RingError(self._refusal(arguments[TAKE_NEXT], length))
        return length

    def _refusal(self, k: int, code: int) -> str:
        """What r4d_ring_take_p's `code` says about record k, in read()'s words."""
        if code == -1:
            length = _SEQ_LENGTH.unpack_from(self._bytes, self._offsets[(k - 1) % self.slots] + MAC_BYTES)[1]
            return f"{self.what}: record {k} claims {length} bytes, over its {self.capacity}-byte slot"
        if code == -2:
            return f"{self.what}: record {k} does not verify under the launch's secret (forged or torn)"
        if code == -3:
            return f"{self.what}: slot of record {k} holds record {self._arguments[TAKE_FOUND]}"
        if code == NOT_PUBLISHED:
            return f"{self.what}: record {k} is not published after its wait"
        return f"{self.what}: a {len(self.secret)}-byte secret, not 1 to 64 (keyed BLAKE2b)"

    def _wait(self, k: int, timeout: float | None, check, spin_ns: int, expect_s: float, poll_s: float) -> None:
        start = time.monotonic()
        if expect_s > 0 and self._sleep(k, start + expect_s, start, timeout, check, poll_s):
            return
        if self._spin(k, spin_ns):
            return
        self._sleep(k, None, start, timeout, check, poll_s)

    def _spin(self, k: int, spin_ns: int) -> bool:
        """Whether record k came while spinning `spin_ns`, giving the core to any runnable process
        every few reads (a wake from sleep costs tens of microseconds on a VM; a spin costs a core)."""
        words, until, spins = self._words, time.perf_counter_ns() + spin_ns, 0
        while time.perf_counter_ns() < until:
            if words[_PUBLISHED] >= k:
                return True
            spins += 1
            if spins % 16 == 0:
                os.sched_yield()
        return False

    def _sleep(self, k: int, until: float | None, start: float, timeout: float | None, check,
               poll_s: float = 0.0) -> bool:
        """Sleep on the signal word (or in naps of `poll_s`) until record k (True) or `until` passes
        (False; None: no end but the timeout), calling `check` and watching the writer's process
        between slices."""
        looked = time.monotonic()
        while True:
            seen = int(self.signal[0])
            if int(self.published[0]) >= k:
                return True
            now = time.monotonic()
            if until is not None and now >= until:
                return False
            pause = self.slice_s if until is None else min(self.slice_s, until - now)
            if poll_s > 0:
                time.sleep(pause if until is not None else min(pause, poll_s))
            else:
                self.sleeping[self.index] = 1
                self._fence()  # the writer sees this sleeper, or this reader sees its record (above)
                if int(self.published[0]) < k:
                    futex.wait(self.signal_address, seen, pause)
                self.sleeping[self.index] = 0
            if int(self.published[0]) >= k:
                return True
            if poll_s > 0 and time.monotonic() - looked < self.slice_s:
                continue  # napping: the checks below stay once a slice
            looked = time.monotonic()
            if check is not None:
                check()
            if not _alive(self.writer_pid):
                raise PeerGone(f"{self.what}: its writer (pid {self.writer_pid}) is gone before record {k}")
            if timeout is not None and time.monotonic() - start > timeout:
                raise RingTimeout(f"{self.what}: record {k} did not come in {timeout:g} s")
