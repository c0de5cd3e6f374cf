"""A pipeline stage boundary inside one host: the receiving rank's segment `rad.<run>.pipe.<rank>`,
which the sending rank maps.

    [ header, 64 bytes ][ READY word ][ DONE word ] (a cache line each) [ pad to a page ]
    [ slot 0: slot_bytes ][ slot 1: slot_bytes ]

The send row of epoch e (`RadPeers.epoch`, bumped by each launch at both ends, which launch the
same sequence) waits for DONE >= e - 2 (the receiver has copied out what slot e & 1 held last),
writes slot e & 1 and stores e into READY; the recv row waits for READY >= e, copies slot e & 1 and
stores e into DONE. `RadPeers` of a pipe: rank 0 sends, rank 1 receives, `buffers[0]` the two
slots, `flags[0]` the sender's word (READY), `flags[1]` the receiver's (DONE)."""

from __future__ import annotations

import struct

import numpy as np

from radiance.abi import RadPeers

from .shm import PAGE, Segment, round_up

KIND = "pipe"
MAGIC = b"RADPIPE1"
HEADER_BYTES, WORD_STRIDE = 64, 64
DATA_OFFSET = round_up(HEADER_BYTES + 2 * WORD_STRIDE, PAGE)
SLOTS = 2
_HEADER = struct.Struct("<8sqq")  # magic, receiving rank, slot bytes


def slot_bytes(nbytes: int) -> int:
    return round_up(max(int(nbytes), 1), PAGE)


class ShmPipe:
    """One end of a boundary: `create` (the receiver), `attach` (the sender), `peers`, `close`."""

    def __init__(self, segment: Segment, sender: bool, slot: int):
        self.segment, self.sender, self.slot = segment, sender, slot
        slots = segment.array[DATA_OFFSET:DATA_OFFSET + SLOTS * slot]
        words = segment.words(HEADER_BYTES, 2, WORD_STRIDE)
        self.peers = RadPeers(rank=0 if sender else 1, world_size=2, buffers=[slots], buffer_bytes=slot,
                              flags=[words[0:1], words[1:2]], epoch=0)

    @classmethod
    def create(cls, run_id: str, rank: int, nbytes: int, kind: str = KIND) -> "ShmPipe":
        """The receiving end: rank `rank`'s pipe, holding messages of up to `nbytes` (`kind`: its
        segment's, where a rank receives through two pipes)."""
        slot = slot_bytes(nbytes)

        def init(array):
            array[:_HEADER.size] = np.frombuffer(_HEADER.pack(MAGIC, int(rank), slot), np.uint8)

        return cls(Segment.create(run_id, kind, rank, DATA_OFFSET + SLOTS * slot, init=init), False, slot)

    @classmethod
    def attach(cls, run_id: str, rank: int, kind: str = KIND) -> "ShmPipe":
        """The sending end, mapping receiving rank `rank`'s pipe of run `run_id`."""
        segment = Segment.attach(run_id, kind, rank)
        magic, owner, slot = _HEADER.unpack(bytes(segment.array[:_HEADER.size]))
        if magic != MAGIC or owner != rank or segment.size < DATA_OFFSET + SLOTS * slot:
            segment.close()
            raise RuntimeError(f"{segment.name} is not rank {rank}'s pipe")
        return cls(segment, True, slot)

    def close(self) -> None:
        self.peers.buffers, self.peers.flags = [], []
        self.segment.close()
        if not self.sender:
            self.segment.unlink()
