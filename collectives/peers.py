"""Host peers: what a collective row reaches of the other ranks on one machine (RadPeers).

Each rank creates one segment, `rad.<run>.peers.<rank>`:

    [ header, 64 bytes ][ N_FLAGS flag words, one cache line (64 bytes) apart ][ pad to a page ]
    [ slot 0: buffer_bytes ][ slot 1: buffer_bytes ]

`RadPeers.buffers[r]` is a uint8 view of rank r's two slots (2 * buffer_bytes bytes), and
`RadPeers.flags[r]` a uint64 view of its flag words (word i is `flags[r][i:i+1]`). A launch of epoch
e (`RadPeers.epoch`, bumped once per collective launch, the same sequence on every rank) uses slot
`e & 1` of every buffer: rank r writes only its own slot and announces it by storing e into its
flag word; peers read it after seeing the flag reach e.

Why two slots are enough: rank r writes slot `e & 1` again only at epoch e + 2, and it can start
epoch e + 2 only after it has seen every peer's READY flag reach e + 1, which a peer stores only after
it has finished everything of epoch e, including its reads of r's slot. So a fast rank never
overwrites bytes a slow peer still reads. Flags only grow (they hold epochs), so waits are `>=`.

Setup is two steps because a rank can map only what exists: every rank `create`s its own segment,
the launcher's handshake (a multiprocessing Barrier in tests) makes sure all have, then every rank
`attach`es the others'. `close()` unmaps and unlinks the rank's own segment; `unlink_run(run_id)`
removes every segment of a run whatever happened to its ranks.
"""

from __future__ import annotations

import struct

import numpy as np

from radiance.abi import RadPeers

from .shm import PAGE, Segment, round_up

KIND = "peers"
MAGIC = b"RADPEER1"
HEADER_BYTES = 64
FLAG_STRIDE = 64  # one cache line per word: two ranks never write the same line
N_FLAGS = 8
FLAG_READY = 0  # epoch e: this rank's contribution to epoch e is in its slot
FLAG_DONE = 1  # epoch e: this rank's reduced chunk of epoch e is in its slot (reduce-scatter)
SLOTS = 2
_HEADER = struct.Struct("<8siiqq")  # magic, rank, world, buffer_bytes, n_flags

DATA_OFFSET = round_up(HEADER_BYTES + N_FLAGS * FLAG_STRIDE, PAGE)


def slot_bytes(buffer_bytes: int) -> int:
    """The capacity of one slot: what one launch may publish, rounded up to a page."""
    return round_up(max(int(buffer_bytes), 1), PAGE)


def segment_bytes(buffer_bytes: int) -> int:
    """The size of one rank's peers segment."""
    return DATA_OFFSET + SLOTS * slot_bytes(buffer_bytes)


def run_shm_bytes(world: int, buffer_bytes: int) -> int:
    """/dev/shm a run of `world` host ranks needs: every rank's peers segment plus its gate and chain
    segments (a page each), for the launcher's check before it starts anything."""
    return world * (segment_bytes(buffer_bytes) + 2 * PAGE)


class HostPeers:
    """One rank's view of the run's peer segments. `create`, barrier, `attach`, ..., `close`."""

    def __init__(self, run_id: str, rank: int, world: int, buffer_bytes: int, own: Segment):
        self.run_id, self.rank, self.world = run_id, int(rank), int(world)
        self.buffer_bytes = slot_bytes(buffer_bytes)
        self.own = own
        self.segments: list[Segment | None] = [None] * self.world
        self.segments[self.rank] = own
        self.peers: RadPeers | None = None

    @classmethod
    def create(cls, run_id: str, rank: int, world: int, buffer_bytes: int) -> "HostPeers":
        """Create this rank's segment (header written, flags zero). Raises ShmSpaceError when /dev/shm
        is too small, FileExistsError when the run already has this rank's segment."""
        if not 0 <= int(rank) < int(world):
            raise ValueError(f"rank {rank} is not in a world of {world}")
        header = _HEADER.pack(MAGIC, int(rank), int(world), slot_bytes(buffer_bytes), N_FLAGS)
        header = header.ljust(HEADER_BYTES, b"\0")

        def init(array):
            array[:HEADER_BYTES] = np.frombuffer(header, np.uint8)

        own = Segment.create(run_id, KIND, rank, segment_bytes(buffer_bytes), init=init)
        return cls(run_id, rank, world, buffer_bytes, own)

    def attach(self) -> RadPeers:
        """Map every peer's segment (after all ranks have created theirs) and build the RadPeers."""
        if self.peers is not None:
            return self.peers
        for r in range(self.world):
            if self.segments[r] is None:
                segment = Segment.attach(self.run_id, KIND, r)
                try:
                    self._check_header(segment, r)
                except BaseException:
                    segment.close()
                    raise
                self.segments[r] = segment
        buffers = [s.array[DATA_OFFSET:DATA_OFFSET + SLOTS * self.buffer_bytes] for s in self.segments]
        flags = [s.words(HEADER_BYTES, N_FLAGS, FLAG_STRIDE) for s in self.segments]
        self.peers = RadPeers(rank=self.rank, world_size=self.world, buffers=buffers,
                              buffer_bytes=self.buffer_bytes, flags=flags, epoch=0)
        return self.peers

    def _check_header(self, segment: Segment, r: int) -> None:
        magic, rank, world, buffer_bytes, n_flags = _HEADER.unpack(bytes(segment.array[:_HEADER.size]))
        if magic != MAGIC or rank != r:
            raise RuntimeError(f"{segment.name} is not rank {r}'s peers segment of run {self.run_id}")
        if (world, buffer_bytes, n_flags) != (self.world, self.buffer_bytes, N_FLAGS):
            raise RuntimeError(f"rank {r} created its peers segment for world {world} with {buffer_bytes}-byte "
                               f"buffers; rank {self.rank} expects world {self.world} with {self.buffer_bytes}")
        if segment.size < segment_bytes(self.buffer_bytes):
            raise RuntimeError(f"{segment.name} is {segment.size} bytes, short of {segment_bytes(self.buffer_bytes)}")

    def close(self, unlink: bool = True) -> None:
        """Drop the views, unmap every segment, and unlink this rank's own (unless unlink=False)."""
        if self.peers is not None:
            self.peers.buffers, self.peers.flags = [], []
            self.peers = None
        for segment in self.segments:
            if segment is not None:
                segment.close()
        if unlink:
            self.own.unlink()
        self.segments = [None] * self.world

    def __enter__(self) -> "HostPeers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
