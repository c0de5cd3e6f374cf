"""DevicePeers: what libr4d's device collective rows reach of the other ranks (RadArgs.peers on a
card rank), built after HostPeers is created and attached. Two forms, one interface:

- p2p=True: DeviceP2P (device_p2p.py): each rank's region on its card, exported by IPC handle and
  opened by every peer; the kernels move bytes over NVLink / PCIe P2P.
- p2p=False, the host-staged twin (DeviceHostStaged): each rank's region lives in POSIX shared memory
  that every rank attaches and registers on its card (device.map_host); the SAME kernels, compiled
  with RAD_P2P_HOST_MAPPED (allreduce.cu says what that changes), move bytes over PCIe into pinned
  host memory. Only the words no peer touches (epochs, arrival count, error) stay on the card.

Setup and teardown talk through shared memory only, no coordinator: every rank creates
`rad.<run>.devpeers.<rank>` (a board of 3 pages, then the host-staged region), stores a generation
count into its HostPeers flag word FLAG_BOARD (host rows use words 0 and 1 only), waits for every
peer's, and attaches their boards. `ShmBoard.exchange(payload) -> list[bytes]` is then an
all-gather: round k writes the payload into page 1 + (k & 1) and k into the round word; a rank
rewrites that page at round k + 2 only after every peer has reached k + 1, so after it read round k.
"""

from __future__ import annotations

import struct

import numpy as np

from radiance.abi import RAD_OK, rad_wait_word

from .device_p2p import CTRL_BYTES, DEFAULT_TIMEOUT_S, DeviceP2P, region_bytes
from .peers import N_FLAGS
from .shm import PAGE, Segment

KIND = "devpeers"
FLAG_BOARD = N_FLAGS - 1            # HostPeers flag word: "my devpeers segment of generation g exists"
BOARD_BYTES = 3 * PAGE              # round word | payload of even rounds | payload of odd rounds
MAX_PAYLOAD = PAGE - 8
EXCHANGE_TIMEOUT_S = 120.0


class ShmBoard:
    """Every rank's devpeers segment, attached; `extra_bytes` after the board are the caller's."""

    def __init__(self, host_peers, extra_bytes: int = 0, timeout_s: float = EXCHANGE_TIMEOUT_S):
        peers = host_peers.attach()
        self.run_id, self.rank, self.world = host_peers.run_id, int(host_peers.rank), int(host_peers.world)
        self.timeout_ns, self.round = int(timeout_s * 1e9), 0
        self.own = Segment.create(self.run_id, KIND, self.rank, BOARD_BYTES + int(extra_bytes))
        self.segments: list[Segment | None] = [None] * self.world
        self.segments[self.rank] = self.own
        try:
            flags = [peers.flags[r][FLAG_BOARD:FLAG_BOARD + 1] for r in range(self.world)]
            self.generation = int(flags[self.rank][0]) + 1   # every rank builds boards in the same sequence
            flags[self.rank][0] = self.generation
            for r in range(self.world):
                self._wait(flags[r], self.generation, f"rank {r}'s devpeers segment")
                if self.segments[r] is None:
                    self.segments[r] = Segment.attach(self.run_id, KIND, r)
        except BaseException:
            self.close()
            raise
        self.rounds = [s.words(0, 1) for s in self.segments]

    def _wait(self, word, value: int, what: str) -> None:
        if rad_wait_word(word, value, self.timeout_ns) != RAD_OK:
            raise TimeoutError(f"device peers, rank {self.rank}: waited {self.timeout_ns / 1e9:.0f} s for {what}")

    def exchange(self, payload: bytes) -> list[bytes]:
        """All-gather: every rank's payload, rank order. Every rank calls it the same number of times."""
        payload = bytes(payload)
        if len(payload) > MAX_PAYLOAD:
            raise ValueError(f"device peers: a {len(payload)}-byte payload is over {MAX_PAYLOAD}")
        self.round += 1
        k, page = self.round, PAGE * (1 + (self.round & 1))
        own = self.own.array
        own[page:page + 8] = np.frombuffer(struct.pack("<Q", len(payload)), np.uint8)
        own[page + 8:page + 8 + len(payload)] = np.frombuffer(payload, np.uint8)
        self.rounds[self.rank][0] = k                        # x86 TSO: the payload is visible first
        out = []
        for r, segment in enumerate(self.segments):
            self._wait(self.rounds[r], k, f"rank {r} in exchange round {k}")
            size = struct.unpack("<Q", bytes(segment.array[page:page + 8]))[0]
            out.append(bytes(segment.array[page + 8:page + 8 + size]))
        return out

    def region(self, r: int, nbytes: int) -> np.ndarray:
        """Rank r's `nbytes` after the board (the host-staged region)."""
        segment = self.segments[r]
        if segment.size < BOARD_BYTES + nbytes:
            raise RuntimeError(f"{segment.name} is {segment.size} bytes, short of {BOARD_BYTES + nbytes}")
        return segment.array[BOARD_BYTES:BOARD_BYTES + nbytes]

    def close(self) -> None:
        """Unmap every board and unlink this rank's own (its peers keep their mappings until they close)."""
        self.rounds = []
        for segment in self.segments:
            if segment is not None:
                segment.close()
        self.segments = [None] * self.world
        self.own.unlink()


# Host-staged messages up to this many bytes go one-shot, larger ones two-shot: over PCIe the
# two-shot kernel's halved traffic wins from 2 MiB (bench/allreduce_device_rows.py on 2 x H200:
# 1 MiB 51 / 52 us, 2 MiB 91 / 85 us, 8 MiB 348 / 317 us, one-shot / two-shot, graph replay).
HOST_ONE_SHOT_MAX_BYTES = 1 << 20


class DeviceHostStaged(DeviceP2P):
    """DeviceP2P's kernels over regions in shared memory mapped on every card (no P2P needed)."""

    COMPILE_OPTIONS = ("-DRAD_P2P_HOST_MAPPED=1",)

    def slot_form(self, nbytes: int) -> str:
        return "one_shot" if nbytes <= HOST_ONE_SHOT_MAX_BYTES else "two_shot"

    def __init__(self, device, rank: int, world: int, buffer_bytes: int, board: ShmBoard, **options):
        self.board, self.mapped, self.local_words = board, [], None
        super().__init__(device, rank, world, buffer_bytes, board.exchange, **options)

    def _regions(self, max_blocks: int) -> tuple[list[int], int]:
        device, nbytes = self.device, self.region_bytes
        self.local_words = device.alloc(CTRL_BYTES, "host-staged collectives: local words")
        device.copy_to_device(self.local_words, np.zeros(CTRL_BYTES, np.uint8))
        device.synchronize()
        self._agree(self.exchange(self._terms(max_blocks)))
        bases = []
        for r in range(self.world):
            view = self.board.region(r, nbytes)   # zero-filled at creation: flags start at 0
            bases.append(device.map_host(view))
            self.mapped.append(view)
        return bases, self.local_words.ptr

    def _release_peers(self) -> None:
        for view in self.mapped:
            self.device.unmap_host(view)
        self.mapped = []

    def _release_own(self) -> None:
        if self.local_words is not None:
            self.device.free(self.local_words)
            self.local_words = None


def _stream_handle(stream):
    """An EngineStream's driver stream (None: the device's default stream; a raw handle as is)."""
    return getattr(stream, "handle", stream)


class DevicePeers:
    """A card rank's device collectives. `buffer_bytes`: the largest message (all_reduce: count * 4;
    all_gather: this rank's m * n * 4). `wire`: what an all-reduce moves (docs/COLLECTIVES.md,
    "The row family"). Launches are asynchronous on the stream, allocate nothing and
    never synchronise, so they can be captured in a CUDA graph."""

    def __init__(self, device, host_peers, p2p: bool, buffer_bytes: int, *, max_blocks: int | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, wire: str = "f32", ll_max_bytes: int | None = None):
        """`wire`: f32 or bf16, what an all-reduce moves (the activations stay f32; every rank alike)."""
        self.rank, self.world_size = int(host_peers.rank), int(host_peers.world)
        self.p2p, self.buffer_bytes, self.device, self.wire = bool(p2p), int(buffer_bytes), device, wire
        self.board = ShmBoard(host_peers, 0 if p2p else region_bytes(buffer_bytes, self.world_size, ll_max_bytes))
        options = dict(max_blocks=max_blocks, timeout_s=timeout_s, wire=wire, ll_max_bytes=ll_max_bytes)
        try:
            if self.p2p:
                self.impl = DeviceP2P(device, self.rank, self.world_size, buffer_bytes, self.board.exchange, **options)
            else:
                self.impl = DeviceHostStaged(device, self.rank, self.world_size, buffer_bytes, self.board, **options)
        except BaseException:
            self.board.close()
            raise

    @property
    def form(self) -> str:
        return "p2p" if self.p2p else "host"

    def all_reduce(self, stream, x, y, count: int, gate: int = 0) -> None:
        """y = the rank-order sum of every rank's x (count f32 at device addresses; y may be x);
        `gate`: the device address of this rank's mapped link-gate word, stored 0 once the peers'
        bytes have landed (colour 2), or 0."""
        self.impl.all_reduce(x, y, count, "f32", stream=_stream_handle(stream), gate=int(gate or 0))

    def all_reduce_add_rmsnorm(self, stream, x, residual, w, y, m: int, n: int, eps: float, gate: int = 0) -> None:
        """One launch: x = the rank-order sum of every rank's x [m, n]; residual = residual + x;
        y = rmsnorm(residual) * w (w: n f32); all f32 at device addresses; gate as all_reduce."""
        self.impl.all_reduce_add_rmsnorm(x, residual, w, y, m, n, eps, stream=_stream_handle(stream),
                                         gate=int(gate or 0))

    def all_gather(self, stream, x, y, m: int, n: int, gate: int = 0) -> None:
        """y[:, p*n:(p+1)*n] = rank p's x; x (m, n) f32, y (m, world * n) f32; gate as all_reduce."""
        self.impl.all_gather(x, y, m, n, 4, stream=_stream_handle(stream), gate=int(gate or 0))

    def timed_out(self, stream=None) -> bool:
        return self.impl.timed_out(_stream_handle(stream))

    def close(self) -> None:
        """After the caller has synchronised its streams: closes the peers' mappings (a shm barrier
        before anyone frees), frees this rank's region, unlinks its segment."""
        if self.board is None:
            return
        try:
            self.impl.close()
        finally:
            self.board.close()
            self.board = None
