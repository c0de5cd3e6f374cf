"""Run ahead over pipeline stages: the tokens the last stage samples, to the first stage, which
embeds them in the next step (generation/feed.py), through shared memory and never through the
coordinator. The same TP rank of the last stage sends to each rank of the first (every rank of the
last stage samples the same tokens). A pipe.py pipe of its own kind, whose message is one
micro-batch's tokens as (sequence index in the step, token) pairs, in `depth` slots (the pipe's
two slots, carved):

    slot: [ count: int64 ][ count x (index, token): int32 ]

Message e is slot e % depth; the sender waits for DONE >= e - depth before writing it again, the
receiver for READY >= e before reading it (collectives/pipe.py's protocol, here spoken from
Python). The first stage takes a step's messages at the latest when it has run the next step, so
at most two steps' messages are ever in flight: with a depth of twice the parts a step is cut into,
the last stage never waits to send, and so never waits on the first stage while the first waits
to send it activations (which, with the pipe's two slots, could otherwise deadlock)."""

from __future__ import annotations

import os

import numpy as np

from radiance.abi import RAD_OK, rad_wait_word

from .pipe import ShmPipe

KIND = "tokens"
READY, DONE = 0, 1
WAIT_TIMEOUT_NS = int(float(os.environ.get("RADIANCE_COLLECTIVE_TIMEOUT_S", "120")) * 1e9)


def message_bytes(max_seqs: int) -> int:
    return 8 + 8 * max_seqs


class TokenPipe:
    """`create` (a rank of the first stage, receiving), `attach` (of the last, sending), `send`,
    `recv`, `close`."""

    def __init__(self, pipe: ShmPipe, max_seqs: int, depth: int):
        self.pipe, self.epoch, self.depth = pipe, 0, depth
        self.slot_bytes = message_bytes(max_seqs)
        self.slots, self.flags = pipe.peers.buffers[0], pipe.peers.flags
        if len(self.slots) < depth * self.slot_bytes:
            raise RuntimeError(f"{pipe.segment.name} holds fewer than {depth} messages of {max_seqs} tokens")

    @classmethod
    def create(cls, run_id: str, rank: int, max_seqs: int, depth: int) -> "TokenPipe":
        """The receiving end, rank `rank`'s (of the first stage)."""
        return cls(ShmPipe.create(run_id, rank, -(-depth * message_bytes(max_seqs) // 2), kind=KIND), max_seqs, depth)

    @classmethod
    def attach(cls, run_id: str, rank: int, max_seqs: int, depth: int) -> "TokenPipe":
        """The sending end, mapping receiving rank `rank`'s."""
        return cls(ShmPipe.attach(run_id, rank, kind=KIND), max_seqs, depth)

    def _slot(self, epoch: int) -> np.ndarray:
        offset = (epoch % self.depth) * self.slot_bytes
        return self.slots[offset:offset + self.slot_bytes]

    def send(self, pairs: np.ndarray) -> None:
        """One micro-batch's (index, token) pairs, int32 [k, 2]."""
        pairs = np.ascontiguousarray(pairs, np.int32)
        if 8 + pairs.nbytes > self.slot_bytes:
            raise RuntimeError(f"{len(pairs)} tokens do not fit the token pipe's {self.slot_bytes}-byte slot")
        self.epoch = epoch = self.epoch + 1
        if epoch > self.depth and rad_wait_word(self.flags[DONE], epoch - self.depth, WAIT_TIMEOUT_NS) != RAD_OK:
            raise RuntimeError("the first stage took no tokens from the token pipe in time")
        slot = self._slot(epoch)
        slot[:8].view(np.int64)[0] = len(pairs)
        slot[8:8 + pairs.nbytes] = pairs.view(np.uint8).reshape(-1)
        self.flags[READY][0] = epoch  # x86 stores are seen in program order: the pairs before the word

    def recv(self) -> np.ndarray:
        """The next message's pairs, int32 [k, 2]."""
        self.epoch = epoch = self.epoch + 1
        if rad_wait_word(self.flags[READY], epoch, WAIT_TIMEOUT_NS) != RAD_OK:
            raise RuntimeError("the last stage sent no tokens through the token pipe in time")
        slot = self._slot(epoch)
        count = int(slot[:8].view(np.int64)[0])
        pairs = slot[8:8 + 8 * count].view(np.int32).reshape(count, 2).copy()
        self.flags[DONE][0] = epoch
        return pairs

    def close(self) -> None:
        self.pipe.close()
