"""The link gate (DESIGN.md, "Link gate and chain") and the link scheduler every bulk transfer goes
through.

Each rank has one gate word in shared memory (`rad.<run>.gate.<rank>`; on a card it would be
registered as mapped memory so a kernel can store to it at system scope). 0: free; nonzero: held
(the value is the hold's sequence number). While it is held the rank's LinkScheduler issues no bulk
chunk (weight loading into the rank, KV moves, staging copies), so a collective has the link, here
the memory bus, to itself.

A `rad_kernel_collective` row takes the hold at launch (`launch_collective`):
- colour 1: the engine ends the hold when the launch returns;
- colour 2: the kernel ends it itself, by storing 0 into `RadArgs.link_gate`, once its peers' bytes
  have landed, and returns RAD_LINK_ENDED; bulk chunks may then flow while the kernel finishes its
  local epilogue. A colour-2 launch that returns with the gate still held is an error naming the row.

Timing records (time.monotonic_ns, comparable across processes on one machine):
- a chunk: (label, offset, bytes, start, end), start taken after the gate was seen free under the
  scheduler's lock, end before the lock is let go;
- a hold: `requested` (the gate word was set), `start` (the in-flight chunk, if any, has drained:
  from here no chunk is in flight), `end` (an upper bound of the moment the gate went back to 0: the
  engine's own store for colour 1; for colour 2 the earlier of the first moment the scheduler saw
  the word at 0 and the launch's return), `returned` (the launch came back) and who ended it.
  Every chunk therefore lies outside every hold's [start, end].
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from radiance.abi import RAD_LINK_ENDED, RAD_OK, rad_backoff

from .shm import PAGE, Segment

KIND = "gate"
DEFAULT_CHUNK_BYTES = 1 << 20


class LinkGateError(RuntimeError):
    """A colour-2 row returned while the link gate was still held (or the gate was misused)."""


class LinkGate:
    """A rank's gate word. `LinkGate.create(run_id, rank)` in shared memory, `LinkGate.attach` from
    another process, or `LinkGate()` in process memory (one process, tests)."""

    def __init__(self, word: np.ndarray | None = None, segment: Segment | None = None):
        self.segment = segment
        self.word = np.zeros(1, np.uint64) if word is None else word

    @classmethod
    def create(cls, run_id: str, rank: int) -> "LinkGate":
        segment = Segment.create(run_id, KIND, rank, PAGE)
        return cls(segment.words(0, 1), segment)

    @classmethod
    def attach(cls, run_id: str, rank: int) -> "LinkGate":
        segment = Segment.attach(run_id, KIND, rank)
        return cls(segment.words(0, 1), segment)

    @property
    def held(self) -> bool:
        return int(self.word[0]) != 0

    def close(self, unlink: bool | None = None) -> None:
        """Unmap; the creator unlinks by default."""
        if self.segment is not None:
            self.word = np.zeros(1, np.uint64)
            self.segment.close()
            if self.segment.owner if unlink is None else unlink:
                self.segment.unlink()
            self.segment = None


@dataclass
class ChunkRecord:
    label: str
    offset: int
    nbytes: int
    start: int
    end: int


@dataclass
class HoldRecord:
    seq: int
    colour: int
    row: str
    requested: int
    start: int = 0
    end: int = 0
    returned: int = 0
    ended_by: str = ""  # "engine" (colour 1, or after an error) or "kernel" (colour 2)
    seen_clear: int = 0  # the first moment the scheduler found the word at 0 during the hold

    @property
    def duration_ns(self) -> int:
        return self.end - self.start


class Transfer:
    """A bulk transfer queued on a LinkScheduler: `wait()` until it has moved every chunk."""

    def __init__(self, label: str, chunks: Iterable[Callable[[], int]]):
        self.label, self.chunks = label, chunks
        self.nbytes = 0
        self.error: BaseException | None = None
        self._done = threading.Event()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> "Transfer":
        if not self._done.wait(timeout):
            raise TimeoutError(f"transfer {self.label!r} did not finish in {timeout} s")
        if self.error is not None:
            raise self.error
        return self


def _flat_bytes(array) -> np.ndarray:
    view = np.asarray(array)
    if not view.flags.c_contiguous:
        raise ValueError("a bulk copy needs C-contiguous arrays")
    return view.reshape(-1).view(np.uint8)


@dataclass
class _Stats:
    holds: int = 0
    total_ns: int = 0
    max_ns: int = 0
    by_colour: dict = field(default_factory=dict)


class LinkScheduler:
    """Moves bulk transfers in chunks on one worker thread, never while the gate is held.

    `copy(dst, src)` / `submit(chunks)` queue work; `hold()` / `release()` bracket what needs the
    link (the engine's collective launches, through `launch_collective`); `holds` and `chunks` are
    the timing records (the last `history` of each); `hold_stats()` sums every hold for /metrics."""

    def __init__(self, gate: LinkGate | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES, history: int = 4096):
        self.gate = gate if gate is not None else LinkGate()
        self.chunk_bytes = int(chunk_bytes)
        self.holds: collections.deque[HoldRecord] = collections.deque(maxlen=history)
        self.chunks: collections.deque[ChunkRecord] = collections.deque(maxlen=history)
        self._stats = _Stats()
        self._lock = threading.Lock()  # held for the whole of one chunk; hold() drains through it
        self._queue: queue.Queue[Transfer | None] = queue.Queue()
        self._open: HoldRecord | None = None
        self._seq = 0
        self._closed = False
        self._stopping = False
        self._worker = threading.Thread(target=self._run, name="rad-link", daemon=True)
        self._worker.start()

    # ---- bulk transfers -------------------------------------------------------------------------

    def submit(self, chunks: Iterable[Callable[[], int]], label: str = "bulk") -> Transfer:
        """Queue a transfer given as chunks: callables that each move one chunk and return its bytes."""
        if self._closed:
            raise RuntimeError("the link scheduler is closed")
        transfer = Transfer(label, chunks)
        self._queue.put(transfer)
        return transfer

    def copy(self, dst, src, label: str = "copy", chunk_bytes: int | None = None) -> Transfer:
        """Queue a byte copy of `src` into `dst` (C-contiguous arrays or buffers of the same size,
        e.g. a weight from the mapped file into the rank's memory), `chunk_bytes` at a time."""
        d, s = _flat_bytes(dst), _flat_bytes(src)
        if d.size != s.size:
            raise ValueError(f"copy {label!r}: destination {d.size} bytes, source {s.size}")
        step = int(chunk_bytes or self.chunk_bytes)

        def chunk(lo):
            def move():
                hi = min(lo + step, s.size)
                d[lo:hi] = s[lo:hi]
                return hi - lo
            move.offset = lo
            return move

        return self.submit((chunk(lo) for lo in range(0, s.size, step)), label)

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every queued transfer has finished."""
        marker = self.submit((), "drain")
        marker.wait(timeout)

    def _wait_clear(self) -> bool:
        """Wait for the gate to read 0, with the back-off of rad_wait_word (spin briefly, then yield,
        then sleep up to 200 us). False when the scheduler closes meanwhile."""
        word = self.gate.word
        for _ in rad_backoff():
            if word[0] == 0:
                return True
            if self._stopping:
                return False

    def _run(self) -> None:
        while True:
            transfer = self._queue.get()
            if transfer is None:
                return
            try:
                for move in transfer.chunks:
                    while True:
                        if not self._wait_clear():
                            raise RuntimeError(f"transfer {transfer.label!r}: the link scheduler closed")
                        with self._lock:
                            if self.gate.word[0] != 0:
                                continue  # a hold came in between: wait again
                            start = time.monotonic_ns()
                            hold = self._open
                            if hold is not None and not hold.seen_clear:
                                hold.seen_clear = start  # a colour-2 kernel ended its hold
                            moved = int(move())
                            end = time.monotonic_ns()
                        break
                    transfer.nbytes += moved
                    self.chunks.append(ChunkRecord(transfer.label, getattr(move, "offset", -1), moved, start, end))
            except BaseException as error:  # noqa: BLE001 - handed to the waiter
                transfer.error = error
            finally:
                transfer._done.set()

    # ---- holds ----------------------------------------------------------------------------------

    def hold(self, colour: int = 1, row: str = "") -> HoldRecord:
        """Take the gate: set the word, then wait for the chunk in flight (if any) to finish. When
        this returns no bulk chunk is in flight, and none starts until the word is 0 again."""
        if self._open is not None or self.gate.word[0] != 0:
            raise LinkGateError(f"hold for {row or 'a launch'}: the link gate is already held "
                                f"({self._open.row if self._open else 'by someone else'})")
        self._seq += 1
        record = HoldRecord(self._seq, colour, row, time.monotonic_ns())
        self.gate.word[0] = self._seq
        with self._lock:
            record.start = time.monotonic_ns()
            self._open = record
        return record

    def release(self, ended_by: str = "engine") -> HoldRecord:
        """End the open hold (colour 1: the engine, when the launch returns)."""
        record = self._open
        if record is None:
            raise LinkGateError("release: the link gate is not held")
        record.end = time.monotonic_ns()
        if not record.returned:
            record.returned = record.end
        self.gate.word[0] = 0
        return self._close(record, ended_by)

    def _close(self, record: HoldRecord, ended_by: str) -> HoldRecord:
        with self._lock:
            self._open = None
        record.ended_by = ended_by
        self.holds.append(record)
        stats = self._stats
        stats.holds += 1
        stats.total_ns += record.duration_ns
        stats.max_ns = max(stats.max_ns, record.duration_ns)
        count, total = stats.by_colour.get(record.colour, (0, 0))
        stats.by_colour[record.colour] = (count + 1, total + record.duration_ns)
        return record

    def hold_totals(self) -> tuple[int, float]:
        """(holds, their total seconds) so far: what a rank's every result carries, without
        hold_stats's dicts (it runs on rank 0's way from one step to the next)."""
        return self._stats.holds, self._stats.total_ns / 1e9

    def hold_stats(self) -> dict:
        """Every hold so far: count, total and longest (seconds), and per colour count and total."""
        s = self._stats
        return {"holds": s.holds, "total_s": s.total_ns / 1e9, "max_s": s.max_ns / 1e9,
                "mean_s": s.total_ns / 1e9 / s.holds if s.holds else 0.0,
                "by_colour": {c: {"holds": n, "total_s": t / 1e9} for c, (n, t) in sorted(s.by_colour.items())}}

    # ---- collective launches --------------------------------------------------------------------

    def launch_collective(self, row_launch: Callable, args, colour: int, name: str | None = None) -> int:
        """Launch a collective row under the gate. Colour 0: a plain launch. Colour 1: hold, launch,
        release. Colour 2: hold, launch; the row must have stored 0 into `args.link_gate` (and
        returned RAD_LINK_ENDED); if it left the gate held, the engine ends the hold and raises
        LinkGateError naming the row. A row returning an error code gets the hold ended and its
        code handed back (the caller reports it)."""
        row = name or getattr(row_launch, "__qualname__", None) or repr(row_launch)
        if colour == 0:
            return row_launch(args)
        if colour not in (1, 2):
            raise ValueError(f"row '{row}': colour {colour} (a collective row is colour 0, 1 or 2)")
        if args.link_gate is None:
            args.link_gate = self.gate.word
        elif not np.shares_memory(args.link_gate, self.gate.word):
            raise LinkGateError(f"row '{row}': RadArgs.link_gate is not this rank's gate word")
        self.hold(colour, row)
        record = self._open
        try:
            status = row_launch(args)
        except BaseException:
            record.returned = time.monotonic_ns()
            self.release("engine (the launch raised)")
            raise
        record.returned = time.monotonic_ns()
        if colour == 1:
            self.release("engine")
            return status
        still_held = self.gate.word[0] != 0
        if still_held:
            self.release("engine (a colour-2 row left it held)")
            if status in (RAD_OK, RAD_LINK_ENDED):
                said = "RAD_LINK_ENDED" if status == RAD_LINK_ENDED else "RAD_OK"
                raise LinkGateError(
                    f"row '{row}' is colour 2 but returned {said} with the link gate still held: a colour-2 "
                    f"row ends the hold itself (stores 0 into RadArgs.link_gate once its peers' bytes have "
                    f"landed) and returns RAD_LINK_ENDED")
            return status
        with self._lock:
            seen = record.seen_clear
        record.end = min(seen, record.returned) if seen else record.returned
        self._close(record, "kernel")
        return status

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the worker after the queued transfers; a transfer that would wait on a held gate fails."""
        if self._closed:
            return
        self._closed = self._stopping = True
        self._queue.put(None)
        self._worker.join(timeout)

    def __enter__(self) -> "LinkScheduler":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def launch_collective(row_launch: Callable, args, colour: int, *, scheduler: LinkScheduler | None = None,
                      name: str | None = None) -> int:
    """The engine's launch of a collective row. With a scheduler: `scheduler.launch_collective`.
    Without one the same rules are enforced on `args.link_gate` alone (no chunks to keep away)."""
    if scheduler is not None:
        return scheduler.launch_collective(row_launch, args, colour, name)
    row = name or getattr(row_launch, "__qualname__", None) or repr(row_launch)
    if colour == 0 or args.link_gate is None:
        if colour == 2 and args.link_gate is None:
            raise LinkGateError(f"row '{row}' is colour 2 but RadArgs.link_gate is not set")
        return row_launch(args)
    gate = args.link_gate
    gate[0] = 1
    try:
        status = row_launch(args)
    except BaseException:
        gate[0] = 0
        raise
    if colour == 1 or gate[0] == 0:
        gate[0] = 0
        return status
    gate[0] = 0
    if status in (RAD_OK, RAD_LINK_ENDED):
        raise LinkGateError(f"row '{row}' is colour 2 but returned with the link gate still held: a colour-2 "
                            f"row ends the hold itself (stores 0 into RadArgs.link_gate) and returns RAD_LINK_ENDED")
    return status
