"""A rank's pipeline stage boundaries: the rank it receives from (the same TP rank of the stage
before) and the one it sends to (of the stage after), whether they share its host, and the pipes.

`device.same_host` is measured, not assumed from the placement: at hello every rank of a pipelined
launch makes a one-page segment holding a random nonce and says where; each rank then maps its
neighbours' and reads their nonces. A neighbour whose segment this rank can read shares its memory
(the same host, the same /dev/shm); one it cannot is on another host. As with device.p2p the launch
takes it for every boundary only where it holds for every one (the ranks of a stage must resolve
the same rows). Where it holds, a boundary is collectives/pipe.py's shared-memory pipe; where it
does not, collectives/link.py's zmq link over TCP with CURVE, bound on this node's address.
Where it holds, each rank of the last stage also sends its sampled tokens to the same TP rank of
the first, through a token pipe (collectives/token_pipe.py), for run ahead."""

from __future__ import annotations

import secrets

import numpy as np
import zmq

from radiance.collectives.curve import Guard, LaunchKeys
from radiance.collectives.link import LinkEnd
from radiance.collectives.pipe import ShmPipe
from radiance.collectives.shm import PAGE, Segment
from radiance.collectives.token_pipe import TokenPipe

from .layout import Layout

PROBE = "host"  # the segment kind of the same-host probe
NONCE_BYTES = 16


class Boundaries:
    def __init__(self, run_id: str, rank: int, layout: Layout, keys: LaunchKeys | None, address: str):
        self.run_id, self.rank, self.keys, self.address = run_id, rank, keys, address
        self.previous, self.next = layout.previous(rank), layout.next(rank)
        # a rank of the last stage sends its sampled tokens to this one (of the first, the same TP rank)
        self.sampler = rank % layout.tp if layout.stage(rank).last else None
        self.tokens_in: TokenPipe | None = None
        self.tokens_out: TokenPipe | None = None
        self.probe: Segment | None = None
        self.receiving = self.sending = None
        self.context: zmq.Context | None = None
        self.guard: Guard | None = None

    def hello(self) -> dict:
        """Make the probe segment; what the neighbours need to read it."""
        nonce = secrets.token_bytes(NONCE_BYTES)

        def init(array):
            array[:NONCE_BYTES] = np.frombuffer(nonce, np.uint8)

        self.probe = Segment.create(self.run_id, PROBE, self.rank, PAGE, init=init)
        return {"run": self.run_id, "nonce": nonce.hex()}

    def same_host(self, hosts: dict) -> int:
        """1 when this rank reads every neighbour's probe (their hello meta, by rank), else 0."""
        for peer in (self.previous, self.next):
            if peer is None:
                continue
            told = hosts[str(peer)]
            try:
                segment = Segment.attach(told["run"], PROBE, peer)
            except (FileNotFoundError, PermissionError):
                return 0
            try:
                if bytes(segment.array[:NONCE_BYTES]) != bytes.fromhex(told["nonce"]):
                    return 0
            finally:
                segment.close()
        return 1

    def measured(self) -> None:
        """Every rank has measured: the probe goes."""
        if self.probe is not None:
            self.probe.close()
            self.probe.unlink()
            self.probe = None

    def _context(self) -> zmq.Context:
        if self.keys is None:
            raise RuntimeError("a stage boundary between hosts needs the launch's keys (radiance-launch --keys)")
        if self.context is None:
            self.context = zmq.Context()
        return self.context

    def create(self, same_host: int, nbytes: int, max_seqs: int, depth: int) -> dict:
        """The receiving end (a stage but the first): what the sender needs to reach it; on the
        first stage (same host), the token pipe's, of `depth` messages of up to `max_seqs` tokens."""
        if self.previous is None:
            if not same_host:
                return {}
            self.tokens_in = TokenPipe.create(self.run_id, self.rank, max_seqs, depth)
            return {"tokens": self.run_id}
        if same_host:
            self.receiving = ShmPipe.create(self.run_id, self.rank, nbytes)
            return {"run": self.run_id}
        context = self._context()
        self.guard = Guard(context, self.keys)
        self.receiving = LinkEnd.bind(context, self.keys, self.address)
        return {"endpoint": self.receiving.endpoint}

    def attach(self, same_host: int, pipes: dict, max_seqs: int, depth: int) -> None:
        """The sending end (a stage but the last), once every receiver has made its end; on the
        last stage (same host), the token pipe's."""
        if self.next is None:
            if same_host:
                self.tokens_out = TokenPipe.attach(pipes[str(self.sampler)]["tokens"], self.sampler, max_seqs, depth)
            return
        told = pipes[str(self.next)]
        if same_host:
            self.sending = ShmPipe.attach(told["run"], self.next)
        else:
            self.sending = LinkEnd.connect(self._context(), self.keys, told["endpoint"])

    def pipes(self) -> dict:
        """What the send and recv rows get as RadArgs.peers."""
        ends = {"recv": self.receiving, "send": self.sending}
        return {op: end.peers for op, end in ends.items() if end is not None}

    def close(self) -> None:
        self.measured()
        for end in (self.sending, self.receiving, self.tokens_out, self.tokens_in):
            if end is not None:
                end.close()
        self.sending = self.receiving = self.tokens_out = self.tokens_in = None
        if self.guard is not None:
            self.guard.close()
            self.guard = None
        if self.context is not None:
            self.context.term()
            self.context = None
