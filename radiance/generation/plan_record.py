"""A step plan as the plans ring carries it (launch/step_rings.py writes it, ranks/session.py reads
it): a fixed binary record, so a rank takes a step's inputs with a handful of byte copies and no
numpy call, JSON or per-step allocation of arrays (docs/RUNTIME.md, "What a step's delivery costs"):

    [ kind: 4 B, b"step" or b"stop" ][ tokens: u32 ][ seqs: u32 ][ blocks: u32 ][ feed pairs: u32 ][ 4 B pad ]
    [ sent: f64, when the coordinator began to write it (perf_counter: CLOCK_MONOTONIC, every rank's clock) ]
    then generation/step_plan.py's arrays in radiance.abi's PLANNED order, each of its STEP_INPUTS
    dtype and shape for (tokens, seqs, blocks) in C order, padded to 8 bytes;
    then the feed (generation/feed.py): its targets, then its sources, int32 each.

`blocks` is a block table's width (the engine's max_blocks, the ranks' too). The record's length
follows from its header; one shorter than that, or a step larger than the rank's step inputs, is
refused in one line."""

from __future__ import annotations

import ctypes
import struct

import numpy as np

from radiance.abi import (PLANNED, RAD_STEP_BLOCK_TABLES, RAD_STEP_CONTEXT_LENS, RAD_STEP_IDS, RAD_STEP_TOKENS,
                          STEP_INPUTS)

from .feed import Feed

HEADER = struct.Struct("<4sIIII4xd")
# the header's shape (a record's layout follows from it alone) and its `sent`
_SHAPE, _SENT = struct.Struct("<4sIIII"), struct.Struct("<d")
STEP, STOP = b"step", b"stop"
_PAD = bytes(8)
_LAYOUTS = 64  # shapes a reader keeps
_TABLE_COPIES = 8  # a take's table: its words before the copies (r4d_ring.c's TABLE_COPIES)
# what a take made of a table (the ring's `made`: r4d_ring.c's MADE_COPIES | MADE_FED, collectives/ring.py's
# names; generation does not import collectives): the plan's arrays and its feed are in the step inputs
FED = 3


def _address(view: memoryview) -> int:
    """Where a writable byte view's first byte lies."""
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


class PlanRecordError(ValueError):
    """A plan record that does not describe a step this rank can take; one line."""


def _padded(nbytes: int) -> int:
    return -(-nbytes // 8) * 8


def encode(arrays: dict, feed: Feed | None = None, sent: float = 0.0) -> bytes:
    """The record of a step's plan arrays (generation/step_plan.py) and its feed; `sent`: when the
    coordinator began to write it (rank 0 reports the plan's delivery from then)."""
    tokens, seqs = len(arrays[RAD_STEP_IDS]), len(arrays[RAD_STEP_CONTEXT_LENS])
    blocks = arrays[RAD_STEP_BLOCK_TABLES].shape[1]
    pairs = 0 if feed is None else len(feed.targets)
    parts = [HEADER.pack(STEP, tokens, seqs, blocks, pairs, sent)]
    for name, dtype, shape, pad in _EXPECTED.get((tokens, seqs, blocks)) or _expected(tokens, seqs, blocks):
        array = arrays[name]
        if (array.dtype is not dtype and array.dtype != dtype) or array.shape != shape:
            raise PlanRecordError(f"plan record: {name} is {array.dtype}{list(array.shape)}, expected "
                                  f"{dtype}{list(shape)}")
        parts.append(array.tobytes())
        if pad:
            parts.append(pad)
    if pairs:
        parts.append(struct.pack(f"<{2 * pairs}i", *feed.targets, *feed.sources))
    return b"".join(parts)


# (tokens, seqs, blocks) -> each planned array's (name, dtype, shape, padding bytes), made once a shape
_EXPECTED: dict[tuple, tuple] = {}


def _expected(tokens: int, seqs: int, blocks: int) -> tuple:
    expected = []
    for name in PLANNED:
        spec = STEP_INPUTS[name]
        dtype, shape = np.dtype(spec.dtype), spec.shape(tokens, seqs, blocks)
        nbytes = dtype.itemsize * int(np.prod(shape))
        expected.append((name, dtype, shape, _PAD[:_padded(nbytes) - nbytes]))
    if len(_EXPECTED) < _LAYOUTS:
        _EXPECTED[(tokens, seqs, blocks)] = tuple(expected)
    return tuple(expected)


def stop() -> bytes:
    """The last record every rank reads."""
    return HEADER.pack(STOP, 0, 0, 0, 0, 0.0)


def size(tokens: int, seqs: int, blocks: int, pairs: int) -> int:
    """A record's bytes."""
    spec = STEP_INPUTS
    arrays = sum(_padded(np.dtype(spec[name].dtype).itemsize * int(np.prod(spec[name].shape(tokens, seqs, blocks))))
                 for name in PLANNED)
    return HEADER.size + arrays + 8 * pairs


class Plan:
    """A record's shape (kind, tokens, seqs, blocks, feed pairs) and all that follows from it: where
    its arrays lie and the copies that write them into the step inputs ((target, source) byte
    views, and the same as r4d_ring.c's table, made once); and the last record of that shape read:
    its feed, where the step still has to apply it (None where it has none, or where the ring's
    take applied it). A reader keeps one Plan a shape and hands it out again for every record of
    the shape (a step makes no object but its feed), so a Plan, and its arrays in the reader's
    buffer, are good until the reader takes the next record."""

    __slots__ = ("kind", "tokens", "seqs", "blocks", "pairs", "entries", "end", "feed_at", "feed_ints", "copies",
                 "table", "address", "feed")

    def __init__(self, kind: str, tokens: int, seqs: int, blocks: int, pairs: int):
        self.kind, self.tokens, self.seqs, self.blocks, self.pairs = kind, tokens, seqs, blocks, pairs
        self.entries, offset = [], HEADER.size  # (name, offset, nbytes, shape)
        for name in PLANNED if kind == "step" else ():
            spec = STEP_INPUTS[name]
            shape = spec.shape(tokens, seqs, blocks)
            nbytes = np.dtype(spec.dtype).itemsize * int(np.prod(shape))
            self.entries.append((name, offset, nbytes, shape))
            offset += _padded(nbytes)
        self.feed_at, self.end = offset, offset + 8 * pairs
        self.feed_ints = struct.Struct(f"<{2 * pairs}i")
        self.copies, self.table, self.address, self.feed = (), None, 0, None


class PlanReader:
    """A rank's end: takes records into a buffer of its own and writes their arrays into its step
    inputs (`inputs`: name -> the executor's arrays at their largest, C-contiguous;
    engine/running/step_inputs.py). What a record needs beyond its bytes is made once a shape.

    `whole`: every plan taken or decoded is in the step inputs when it is handed out (a rank that
    does not cut steps into parts); else the caller writes it (write) or reads its arrays. Whole,
    where the ring takes in C (collectives/ring.py, r4d_ring.c), the take hands it the last plan's
    table (`Plan.table`), which it makes in the same call when the next record has the same shape:
    a decode step's plan then costs one C call and a few lines of Python, on caches the step before
    has flushed (docs/RUNTIME.md, "What a step's delivery costs"). `feeds`: the take applies a
    plan's feed there too, from the step inputs' sampled tokens into its ids (the host executor's
    way, engine/running/host.py; a card takes its feed on the card)."""

    def __init__(self, inputs=None, capacity: int = 4096, whole: bool = False, feeds: bool = False):
        self._inputs = {name: inputs[name] for name in PLANNED} if inputs is not None else None
        self._plans: dict[tuple, Plan] = {}
        self._header = 0  # the bytes before a payload in the buffer: a ring slot's header once one is read
        self._whole = whole and inputs is not None
        # where a take applies the feed (r4d_ring.c): the ids it writes, the sampled tokens it reads
        self._fed = (_address(memoryview(inputs[RAD_STEP_IDS]).cast("B")),
                     _address(memoryview(inputs[RAD_STEP_TOKENS]).cast("B"))) if feeds and self._whole else (0, 0)
        self._ring = None  # the ring whose records the last plan's table takes (native and whole only)
        self._last = None  # that plan
        self._grow(capacity, 0)

    def _grow(self, capacity: int, header: int) -> None:
        """A buffer of `capacity` payload bytes after `header` bytes (ring.take/read put the payload
        after the ring's slot header); the plans' copies read the old one, so they go too."""
        self._buffer = memoryview(bytearray(header + capacity))
        self._payload = self._buffer[header:]
        self._header = header
        self._plans.clear()
        self._ring = self._last = None

    def take(self, ring, sampled: int = 0, **waits) -> Plan:
        """The next record of `ring` (a RingReader: its slots are slot_bytes, of which capacity
        payload). `sampled`: the tokens the step before sampled, which a feed reads below. `waits`:
        the ring's."""
        last = self._last
        if ring is self._ring:  # the ring takes in C, with the last plan's table: this step's path
            length = ring.take(self._buffer, last.address, sampled, **waits)
            made = ring.made
            if made == FED:  # the same shape as the last, its arrays and its feed in the step inputs
                last.feed = None
                return last
            if made:  # its arrays written, its feed left to the step (engine/running/host.py), or refused
                return self._details(last, length)
            return self._decoded(length, ring)
        header = ring.slot_bytes - ring.capacity
        if header != self._header or len(self._buffer) < ring.slot_bytes:
            self._grow(ring.capacity, header)
        if ring.native:
            return self._decoded(ring.take(self._buffer, 0, 0, **waits), ring)
        return self._decoded(len(ring.read(into=self._buffer, **waits)), None)

    def decode(self, payload) -> Plan:
        """The Plan of a record given as bytes (copied into the reader's buffer)."""
        if len(payload) > len(self._payload):
            self._grow(len(payload), self._header)
        self._payload[:len(payload)] = payload
        return self._decoded(len(payload), None)

    def sent(self) -> float:
        """When the coordinator began to write the last record taken (rank 0 reports the plan's
        delivery from then)."""
        return _SENT.unpack_from(self._payload, _SHAPE.size + 4)[0]

    def _decoded(self, length: int, ring) -> Plan:
        """The record of `length` bytes in the buffer, decoded, and written whole where this reader
        writes whole; its table is the next take's where `ring` takes in C."""
        payload = self._payload
        shape = _SHAPE.unpack_from(payload)
        plan = self._details(self._plans.get(shape) or self._plan(*shape), length)
        if self._whole and plan.kind == "step":
            self.write(plan)
            if ring is not None and plan.table is not None:
                self._ring, self._last = ring, plan
        return plan

    def _details(self, plan: Plan, length: int) -> Plan:
        """The record's own: its length checked against its shape, and its feed."""
        if length < plan.end:
            raise PlanRecordError(f"plan record: {length} bytes where its header ({plan.tokens} tokens, {plan.seqs} "
                                  f"sequences, {plan.pairs} fed) describes {plan.end}")
        plan.feed = None
        if plan.pairs:
            ints = plan.feed_ints.unpack_from(self._payload, plan.feed_at)
            plan.feed = Feed(ints[:plan.pairs], ints[plan.pairs:])
        return plan

    def _plan(self, kind: bytes, tokens: int, seqs: int, blocks: int, pairs: int) -> Plan:
        """The Plan of a shape not seen yet (kept, up to _LAYOUTS of them)."""
        if kind not in (STEP, STOP):
            raise PlanRecordError(f"plan record: kind {kind!r}, not a step or a stop")
        plan = Plan(kind.decode(), tokens, seqs, blocks, pairs)
        if plan.end > len(self._payload):
            raise PlanRecordError(f"plan record: a step of {tokens} tokens, {seqs} sequences and {blocks} blocks a "
                                  f"table takes {plan.end} bytes, over the {len(self._payload)} of its ring's slots")
        if self._inputs is not None:
            plan.copies = self._copies(plan)
            if self._whole and plan.copies.__class__ is not str:
                plan.table, plan.address = self._table(plan)
        if len(self._plans) < _LAYOUTS:
            self._plans[(kind, tokens, seqs, blocks, pairs)] = plan
        return plan

    def _copies(self, plan: Plan) -> list | str:
        """(target, source) byte views that write the plan's arrays into the step inputs, or why they
        cannot (one line, raised by write)."""
        copies = []
        for name, start, nbytes, shape in plan.entries:
            target = self._inputs[name]
            if shape[0] > len(target) or (len(shape) == 2 and shape[1] > target.shape[1]):
                return (f"plan record: {name} of a step of {plan.tokens} tokens, {plan.seqs} sequences and "
                        f"{plan.blocks} blocks a table does not fit this rank's step inputs")
            whole = memoryview(target).cast("B")
            rows = [(0, start, nbytes)]
            if len(shape) == 2 and shape[1] != target.shape[1]:  # a narrower block table: row by row
                row = nbytes // shape[0] if shape[0] else 0
                rows = [(r * target.strides[0], start + r * row, row) for r in range(shape[0])]
            copies += [(whole[at:at + size], self._payload[source:source + size]) for at, source, size in rows]
        return copies

    def _table(self, plan: Plan) -> tuple:
        """(the table, its address): the plan's copies and feed as r4d_ring_take_p takes them, u64 words
        [ 20 ][ the record's first 20 bytes (kind and shape) in 3 words ][ count ]
        [ ids' address ][ sampled tokens' address ][ the feed's offset in the payload ]
        [ (target address, payload offset, bytes) x count ], for records of this shape only."""
        prefix = _SHAPE.pack(plan.kind.encode(), plan.tokens, plan.seqs, plan.blocks, plan.pairs)
        payload_at = _address(self._payload)
        rows = [(_address(target), _address(source) - payload_at, len(source)) for target, source in plan.copies
                if len(source)]
        table = np.zeros(_TABLE_COPIES + 3 * len(rows), np.uint64)
        table[0] = len(prefix)
        table[1:4].view(np.uint8)[:len(prefix)] = np.frombuffer(prefix, np.uint8)
        table[4] = len(rows)
        table[5], table[6] = self._fed
        table[7] = plan.feed_at
        if rows:
            table[_TABLE_COPIES:] = np.array(rows, np.uint64).reshape(-1)
        return table, table.ctypes.data

    def write(self, plan: Plan) -> None:
        """The plan's arrays into the step inputs' first rows: byte copies, no numpy call."""
        copies = plan.copies
        if copies.__class__ is str:
            raise PlanRecordError(copies)
        for target, source in copies:
            target[:] = source

    def arrays(self, plan: Plan) -> dict:
        """The plan's arrays as read-only numpy arrays of a copy of the record (a step cut into parts
        needs them)."""
        record = bytes(self._payload[:plan.feed_at])
        arrays = {}
        for name, offset, nbytes, shape in plan.entries:
            dtype = np.dtype(STEP_INPUTS[name].dtype)
            arrays[name] = np.frombuffer(record, dtype, nbytes // dtype.itemsize, offset).reshape(shape)
        return arrays
