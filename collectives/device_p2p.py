"""Device P2P collectives, engine side: the buffers every rank exports and every peer maps, and the
launches of libr4d's device kernels (plugins/kernels/libr4d/device/allreduce.cu) over them.

One rank per card. Each rank allocates one region on its card,

    [ control: CTRL_BYTES ][ slot 0: slot_bytes ][ slot 1: slot_bytes ]

(control = READY and DONE flag words, one per (peer, block), the epoch words, an arrival counter and
an error word), zeroes its control part, exports the region's IPC handle and opens every peer's, so
each rank holds the device address of every rank's region. The kernels do the rest: publish, flag,
wait, sum in rank order, end the link-gate hold (docs/COLLECTIVES.md, "Device P2P").

`exchange(payload: bytes) -> list[bytes]` is the caller's all-gather (one payload per rank, rank
order), as for radiance/device/probe.py: the launcher's handshake in the engine, a pipe or a store in
the benchmark. Every rank calls it the same number of times (twice to set up, twice to close).

The host-staged twin (the same kernels over regions in POSIX shared memory that every card maps,
for cards without P2P) is collectives/device_peers.py's DeviceHostStaged, a subclass that changes
only where the regions live (`_regions`) and the compile option (`COMPILE_OPTIONS`).

Nothing here imports a GPU library: the device object (radiance/device) does the driver calls.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Callable

import numpy as np

from radiance.device import KernelArgs

SOURCE_PATH = Path(__file__).resolve().parent.parent / "plugins" / "kernels" / "libr4d" / "device" / "allreduce.cu"

# Mirrors of the source's RAD_P2P_* defines (tests/test_device_allreduce.py checks they agree).
MAX_WORLD = 8
MAX_BLOCKS = 512
THREADS = 512
READY_OFF = 0
DONE_OFF = 32768
EPOCH_OFF = 65536
ARRIVE_OFF = 69632
ERROR_OFF = 69636
CTRL_BYTES = 131072
STEP_BYTES = 65536                   # a two-shot block's pipeline step
TAG_STEP_BITS = 20                   # a flag holds (epoch << 20) + step + 1
MAX_SLOT_BYTES = 32 << 30            # so a block's steps fit the tag's step field

PACK_BYTES = 16                      # every piece starts on a 16-byte pack
ITEMSIZE = {"f32": 4, "bf16": 2}     # all_reduce dtypes (f32 accumulation)
GATHER_KERNEL = {4: "rad_all_gather_b32", 2: "rad_all_gather_b16"}
KERNELS = tuple(f"rad_all_reduce_{form}_{dtype}" for form in ("one_shot", "two_shot") for dtype in ITEMSIZE) \
    + tuple(GATHER_KERNEL.values())
DEFAULT_TIMEOUT_S = 10.0             # a wait for a peer longer than this gives up and sets ERROR

# Messages up to this many bytes go one-shot, larger ones two-shot (bench/allreduce_device.py
# measures both forms at every size; docs/COLLECTIVES.md has the figures this comes from).
ONE_SHOT_MAX_BYTES = {2: 8 << 20}
ONE_SHOT_MAX_BYTES_DEFAULT = 256 << 10


def one_shot_max_bytes(world: int) -> int:
    return ONE_SHOT_MAX_BYTES.get(world, ONE_SHOT_MAX_BYTES_DEFAULT)


def source() -> str:
    return SOURCE_PATH.read_text()


def source_constants(text: str | None = None) -> dict[str, int]:
    """The source's `#define RAD_P2P_<NAME> <int>` values, by NAME."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^#define RAD_P2P_(\w+)\s+(\d+)\s*$", text or source(), re.M)}


def piece(total: int, parts: int, index: int, elems_per_pack: int) -> tuple[int, int]:
    """Part `index` of `parts` of [0, total) in whole packs, the last part taking the rest (rad_piece)."""
    packs = -(-total // elems_per_pack)
    per = -(-packs // parts) * elems_per_pack
    lo = min(index * per, total)
    return lo, min(lo + per, total)


def slot_bytes_for(buffer_bytes: int) -> int:
    """A slot holds a message of buffer_bytes, plus the two-shot layout's rounding (world packs)."""
    return -(-(int(buffer_bytes) + MAX_WORLD * PACK_BYTES) // 4096) * 4096


def region_bytes(buffer_bytes: int) -> int:
    return CTRL_BYTES + 2 * slot_bytes_for(buffer_bytes)


def grid_for(form: str, nbytes: int, world: int, max_blocks: int) -> int:
    """Blocks of THREADS threads: one 16-byte pack per thread for the part each block handles, at
    most max_blocks (every block must be resident at once: blocks wait for the peers' blocks)."""
    packs = -(-int(nbytes) // PACK_BYTES)
    share = -(-packs // world) if form == "two_shot" else packs
    return max(1, min(int(max_blocks), -(-share // THREADS)))


def _address(value) -> int:
    return int(getattr(value, "ptr", value))


class DeviceP2P:
    """A rank's side of the device collectives. `buffer_bytes` is the largest message (all_reduce:
    count * itemsize; all_gather: this rank's m * n * itemsize) a launch may move."""

    def __init__(self, device, rank: int, world: int, buffer_bytes: int, exchange: Callable[[bytes], list[bytes]],
                 *, max_blocks: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        if not 1 <= world <= MAX_WORLD or not 0 <= rank < world:
            raise ValueError(f"device P2P collectives: rank {rank} of world {world} (1 to {MAX_WORLD} ranks)")
        self.device, self.rank, self.world, self.exchange = device, rank, world, exchange
        self.slot_bytes = slot_bytes_for(buffer_bytes)
        if self.slot_bytes > MAX_SLOT_BYTES:
            raise ValueError(f"device P2P collectives: a {buffer_bytes}-byte buffer is over {MAX_SLOT_BYTES}")
        self.timeout_ns = int(timeout_s * 1e9)
        self.buffer_bytes = int(buffer_bytes)
        self.peers: dict = {}
        mine = int(max_blocks or 2 * int(getattr(device, "multiprocessors", 66)))
        bases, self.local = self._regions(mine)                                              # exchange 1
        self.table = struct.pack(f"<{MAX_WORLD + 1}Q", *bases, *[0] * (MAX_WORLD - world), self.local)
        self.module = device.load(device.compile(source(), self.COMPILE_OPTIONS))
        self.kernels = {name: device.kernel(self.module, name) for name in KERNELS}
        self._args: dict[tuple, object] = {}
        exchange(b"ready")                                                                   # 2

    COMPILE_OPTIONS: tuple[str, ...] = ()

    def _regions(self, max_blocks: int) -> tuple[list[int], int]:
        """This rank's region on its card, exported; every peer's opened. Returns every rank's region
        base (rank order) and the base of this card's local words (EPOCH, ARRIVE, ERROR)."""
        device, rank, world = self.device, self.rank, self.world
        self.region = device.alloc(region_bytes(self.buffer_bytes), "p2p collectives")
        device.copy_to_device(self.region, np.zeros(CTRL_BYTES, np.uint8))
        device.synchronize()
        blobs = self.exchange(struct.pack("<QQ", self.slot_bytes, max_blocks) + device.export_handle(self.region))
        self._agree(blobs)
        self.peers = {p: device.open_handle(blobs[p][16:], self.region.nbytes, f"p2p collectives of rank {p}")
                      for p in range(world) if p != rank}
        return [self.region.ptr if p == rank else self.peers[p].ptr for p in range(world)], self.region.ptr

    def _agree(self, blobs: list[bytes]) -> None:
        """Every blob starts (slot_bytes, max_blocks): the ranks' slots must agree, and every rank
        launches the same grids: the smallest card's limit, at most MAX_BLOCKS."""
        sizes = [struct.unpack_from("<QQ", b) for b in blobs]
        if len({s for s, _ in sizes}) != 1:
            raise ValueError(f"device P2P collectives: the ranks' slot sizes differ: {[s for s, _ in sizes]}")
        self.max_blocks = min(MAX_BLOCKS, *(b for _, b in sizes))

    # ---- the collectives ------------------------------------------------------------------------
    def form_for(self, nbytes: int) -> str:
        return "one_shot" if nbytes <= one_shot_max_bytes(self.world) else "two_shot"

    def all_reduce(self, x, y, count: int, dtype: str = "f32", *, stream=None, gate: int = 0,
                   form: str | None = None, linger_ns: int = 0) -> str:
        """y = the rank-order sum of every rank's x (count elements of dtype; y may be x). `gate`:
        the device address of the mapped link-gate word, stored 0 once the peers' bytes have landed
        (colour 2), or 0. Returns the form launched."""
        if dtype not in ITEMSIZE:
            raise ValueError(f"all_reduce: dtype {dtype!r} (device rows take {', '.join(ITEMSIZE)})")
        count, itemsize = int(count), ITEMSIZE[dtype]
        form = form or self.form_for(count * itemsize)
        if form not in ("one_shot", "two_shot"):
            raise ValueError(f"all_reduce: form {form!r} (one_shot or two_shot)")
        elems = PACK_BYTES // itemsize
        need = count if form == "one_shot" else self.world * piece(count, self.world, 0, elems)[1]
        self._check(x, y, need * itemsize, "all_reduce")
        name = f"rad_all_reduce_{form}_{dtype}"
        key = (name, _address(x), _address(y), count, int(gate), int(linger_ns))
        args = self._args.get(key)
        if args is None:
            args = self._args[key] = (KernelArgs(name).raw(self.table, 8).pointer(x).pointer(y).u64(count)
                                      .i32(self.rank).i32(self.world).u64(self.slot_bytes).u64(int(gate))
                                      .u64(self.timeout_ns).u64(int(linger_ns)).pack())
        grid = grid_for(form, count * itemsize, self.world, self.max_blocks)
        self.device.launch(self.kernels[name], grid, THREADS, args, stream=stream)
        return form

    def all_gather(self, x, y, m: int, n: int, itemsize: int = 4, *, stream=None, gate: int = 0,
                   linger_ns: int = 0) -> None:
        """y[:, p*n:(p+1)*n] = rank p's x, x being (m, n) and y (m, world * n), elements of itemsize bytes."""
        if itemsize not in GATHER_KERNEL:
            raise ValueError(f"all_gather: {itemsize}-byte elements (device rows move 2 or 4)")
        m, n = int(m), int(n)
        self._check(x, y, m * n * itemsize, "all_gather")
        name = GATHER_KERNEL[itemsize]
        key = (name, _address(x), _address(y), m, n, int(gate), int(linger_ns))
        args = self._args.get(key)
        if args is None:
            args = self._args[key] = (KernelArgs(name).raw(self.table, 8).pointer(x).pointer(y).u64(m).u64(n)
                                      .i32(self.rank).i32(self.world).u64(self.slot_bytes).u64(int(gate))
                                      .u64(self.timeout_ns).u64(int(linger_ns)).pack())
        grid = grid_for("all_gather", m * n * itemsize, self.world, self.max_blocks)
        self.device.launch(self.kernels[name], grid, THREADS, args, stream=stream)

    def _check(self, x, y, slot_need: int, what: str) -> None:
        if slot_need > self.slot_bytes:
            raise ValueError(f"{what}: {slot_need} bytes do not fit the {self.slot_bytes}-byte slot "
                             f"(DeviceP2P's buffer_bytes is the largest message)")
        for label, value in (("x", x), ("y", y)):
            if _address(value) % PACK_BYTES:
                raise ValueError(f"{what}: {label} at {_address(value):#x} is not {PACK_BYTES}-byte aligned")

    def timed_out(self, stream=None) -> bool:
        """Whether a wait for a peer gave up (then that launch's results are wrong)."""
        word = np.zeros(1, np.uint32)
        self.device.copy_to_host(word, self.local + ERROR_OFF, stream)
        self.device.synchronize(stream)
        return bool(word[0])

    def close(self) -> None:
        """After this rank's launches (the caller synchronizes its own streams): no peer still reads
        ours, then let go of everything."""
        self.device.synchronize()
        self.exchange(b"closing")                                                            # 3
        self._release_peers()
        self.exchange(b"closed")                                                             # 4
        self._release_own()

    def _release_peers(self) -> None:
        for allocation in self.peers.values():
            self.device.close_handle(allocation)
        self.peers = {}

    def _release_own(self) -> None:
        self.device.free(self.region)
