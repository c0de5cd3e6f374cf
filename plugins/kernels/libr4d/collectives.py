"""libr4d's host collectives: the `_host` twins (device.p2p == 0) of all_reduce and all_gather, a
chained all_reduce, and a fused all_reduce + add + rmsnorm. They move bytes through the shared-memory
peers the engine maps (RadArgs.peers, see docs/COLLECTIVES.md) and import nothing of radiance's but
radiance.abi.

Protocol, per launch of epoch e (`peers.epoch`, bumped once by every launch; every rank launches
the same sequence of collectives):
1. copy this rank's x into its own slot `e & 1` (`peers.buffers[rank]`), then store e into its READY
   flag word. x86 is TSO: stores become visible in program order, so a peer that reads READY >= e
   and then loads the slot sees the bytes (on a weakly ordered CPU this needs a release fence).
2. wait for each peer's READY >= e: with libr4d's native kernels, r4d.c's r4d_wait_word (spin
   briefly, only while the ranks have a core each, then sleep on the word's futex, which the writer
   wakes after each store: a rank waiting for one that shares its core hands that rank the core at
   once, and is woken the moment the bytes are there); else radiance.abi.rad_wait_word (spin
   briefly, yield, then sleep with back-off). Never a pure spin: with more ranks than cores the
   spinner would take the core the awaited rank needs. Then
   - one-shot (x up to one_shot_max_bytes(N), 256 KiB): every rank adds every slot in rank order;
   - reduce-scatter + all-gather (larger): rank r adds chunk r of every slot in rank order, writes
     the result into chunk r of its own slot (only r itself ever reads chunk r of a slot before
     this point), stores e into its DONE flag, waits for every peer's DONE >= e and copies the
     peers' reduced chunks.
   Either way each element is ((x_0 + x_1) + x_2) + ... in the same order on every rank: bit-identical
   results, equal to the rank-order sum.
3. colour 2: once the last of its peers' bytes has been read, store 0 into RadArgs.link_gate and
   return RAD_LINK_ENDED (RAD_OK when the engine gave no gate).
A slot is written again only at epoch e + 2, after this rank has seen every peer's READY >= e + 1,
which each peer stores only after finishing epoch e: a fast rank never overwrites what a slow one
still reads.
"""

import os
import time

import numpy as np

from radiance.abi import (
    RAD_CEQ, RAD_DOMAIN_HOST, RAD_E_DEVICE, RAD_E_NOMEM, RAD_E_SHAPE, RAD_LINK_ENDED, RAD_OK, RAD_OPD_INOUT,
    RAD_OPD_OUT, RAD_OPD_WEIGHT, RAD_P_F64, RAD_P_INT, RAD_P_STR, RAD_PROLE_NONE, RAD_PROLE_SEQ_CHUNK,
    RAD_REQUIRED, RadKernelInfo, RadOperandSpec, RadOpSchema, RadParamSpec, rad_args_getf, rad_args_geti,
    rad_args_geti_or, rad_wait_word, rad_weight_f32,
)

# Messages of at most one_shot_max_bytes(world) bytes go one-shot; larger ones reduce-scatter +
# all-gather. Measured on the 2-core host with bench/allreduce_host.py --threshold (docs/COLLECTIVES.md):
# one-shot wins up to 256 KiB, the two-shot form from 512 KiB on, at 2 ranks as at 3 (it moves about
# the same bytes but each rank adds only its 1/N of them, and a rank's adds are what a shared core
# waits for). A launch may override the limit with the parameter `one_shot_max_bytes`.
ONE_SHOT_MAX_BYTES = 256 << 10


def one_shot_max_bytes(world):
    return ONE_SHOT_MAX_BYTES


# How long a rank waits for a peer before the launch fails with RAD_E_DEVICE (the launcher's
# supervision normally ends a run with a dead rank long before).
WAIT_TIMEOUT_NS = int(float(os.environ.get("RADIANCE_COLLECTIVE_TIMEOUT_S", "120")) * 1e9)
# Reduce-scatter chunks start on a 64-byte boundary (16 f32).
CHUNK_ALIGN_BYTES = 64

READY = 0  # the flag word: "my contribution to epoch e is in my slot"
DONE = 1  # "my reduced chunk of epoch e is in my slot"

# The wait every row uses. A module attribute so a benchmark can swap in a pure spin to measure
# what the back-off is worth; the rows themselves never spin without yielding. use_native_wait
# replaces it (and `_wake`, called after every flag store) with r4d.c's futex wait and wake.
wait_word = rad_wait_word
_wake = None
# How long a native wait spins: while every rank has a core of its own the peer is running and about
# to store; with more ranks than cores it may be waiting for this very core, so none. Then it yields
# the core for up to YIELD_NS (to a rank sharing it; the core stays awake: waking a halted core of
# this KVM guest costs more than the yields) before it sleeps on the futex.
SPIN_NS_OWN_CORES = 20_000
YIELD_NS = 1_000_000
SLICE_NS = 50_000_000  # the longest a native wait stays in C before Python runs its signal handlers

F32 = np.float32


class _Failed(Exception):
    def __init__(self, status):
        super().__init__(status)
        self.status = status


# ---- helpers ------------------------------------------------------------------------------------

def _rows(array, m, n):
    """The [m, n] view of an operand (2-D, or 1-D holding m*n elements)."""
    if array.ndim == 2:
        if array.shape[1] < n or array.shape[0] < m:
            raise _Failed(RAD_E_SHAPE)
        return array[:m, :n]
    flat = array.reshape(-1)
    if flat.size < m * n:
        raise _Failed(RAD_E_SHAPE)
    return flat[:m * n].reshape(m, n)


def _world(peers):
    return 1 if peers is None else int(peers.world_size)


def _next_epoch(peers):
    peers.epoch = int(peers.epoch) + 1
    return peers.epoch


def _slot(peers, rank, epoch, count, dtype):
    """`count` elements of rank's slot for this epoch."""
    itemsize = np.dtype(dtype).itemsize
    offset = (epoch & 1) * int(peers.buffer_bytes)
    return peers.buffers[rank][offset:offset + count * itemsize].view(dtype)


def _flag(peers, rank, which):
    return peers.flags[rank][which:which + 1]


def _wait(peers, rank, which, epoch):
    if wait_word(_flag(peers, rank, which), epoch, WAIT_TIMEOUT_NS) != RAD_OK:
        raise _Failed(RAD_E_DEVICE)


def _store_flag(peers, which, epoch):
    """My flag word `which` = epoch, then the peers asleep on it woken (with the native wait)."""
    flags = peers.flags[peers.rank]
    flags[which] = epoch
    if _wake is not None:
        _wake(flags.__array_interface__["data"][0] + which * flags.strides[0])


def use_native_wait(wait, wake) -> None:
    """Take libr4d's native waits: `wait(address, value, spin_ns, yield_ns, timeout_ns) -> 0 or -1` and
    `wake(address)` (r4d.c's r4d_wait_word and r4d_wake_word)."""
    global wait_word, _wake
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def native_wait(word, value, timeout_ns=0):
        address, value = word.__array_interface__["data"][0], int(value)
        spin = SPIN_NS_OWN_CORES if _WORLD[0] <= cores else 0
        if wait(address, value, spin, YIELD_NS, min(timeout_ns or SLICE_NS, SLICE_NS)) == 0:
            return RAD_OK
        # A long wait: in slices that come back to Python, where a SIGTERM's handler can run (a
        # signal does not end the C call), sleeping on the futex from the start.
        deadline = time.monotonic_ns() + timeout_ns if timeout_ns else None
        while deadline is None or time.monotonic_ns() < deadline:
            if wait(address, value, 0, 0, SLICE_NS) == 0:
                return RAD_OK
        return RAD_E_DEVICE

    wait_word, _wake = native_wait, wake


_WORLD = [1]  # the world size of the last collective launched (every collective of a run has the same)


def _wait_chain(chain):
    if chain is not None and wait_word(chain.wait_word, int(chain.wait_value), WAIT_TIMEOUT_NS) != RAD_OK:
        raise _Failed(RAD_E_DEVICE)


def _bump_chain(chain):
    if chain is not None:
        chain.bump_word[0] = int(chain.bump_value)


def _end_link(a):
    """Colour 2: the peers' bytes have landed; give the link back."""
    if a.link_gate is None:
        return RAD_OK
    a.link_gate[0] = 0
    return RAD_LINK_ENDED


def _narrow(dtype):
    return np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64))


def _ordered_sum_into(out, sources, start=0):
    """out = ((sources[0] + sources[1]) + ...)[start:], reading the sources lazily: `sources(p)`
    gives rank p's piece after waiting for it. Narrow floats add in f32 and round once."""
    count = len(sources)
    if _narrow(out.dtype):
        acc = np.asarray(sources[0](), dtype=F32).copy()
        for p in range(1, count):
            acc += np.asarray(sources[p](), dtype=F32)
        np.copyto(out, acc.astype(out.dtype))
        return
    if count == 1:
        np.copyto(out, sources[0]())
        return
    first = sources[0]()
    np.add(first, sources[1](), out=out)
    for p in range(2, count):
        np.add(out, sources[p](), out=out)


# ---- the transport ------------------------------------------------------------------------------

def _publish(peers, epoch, xs):
    """Step 1: my contribution into my slot, then my READY flag (stores in program order: TSO)."""
    m, n = xs.shape
    own = _slot(peers, peers.rank, epoch, m * n, xs.dtype).reshape(m, n)
    np.copyto(own, xs)
    _WORLD[0] = int(peers.world_size)
    _store_flag(peers, READY, epoch)


def _chunk(count, world, r, itemsize):
    align = max(CHUNK_ALIGN_BYTES // itemsize, 1)
    per = -(-count // world)
    per = -(-per // align) * align
    return min(count, r * per), min(count, (r + 1) * per)


def _reduce(a, xs, epoch, chain):
    """Steps 2 of all_reduce into xs (already published). Returns when xs holds the sum."""
    peers = a.peers
    world, rank = _world(peers), peers.rank
    m, n = xs.shape
    count = m * n
    nbytes = count * xs.dtype.itemsize
    _wait_chain(chain)  # the r4dchain prologue: my contribution is out, now wait for my dependency

    def piece(p, lo=0, hi=count, flag=READY):
        def get():
            if p != rank:
                _wait(peers, p, flag, epoch)
            return _slot(peers, p, epoch, count, xs.dtype)[lo:hi]
        return get

    limit = rad_args_geti_or(a, "one_shot_max_bytes", one_shot_max_bytes(world))
    if nbytes <= limit:
        sources = [piece(p) for p in range(world)]
        if xs.flags.c_contiguous:
            _ordered_sum_into(xs.reshape(-1), sources)
        else:
            total = np.empty(count, xs.dtype)
            _ordered_sum_into(total, sources)
            np.copyto(xs, total.reshape(m, n))
        return
    # reduce-scatter: my chunk of every slot, in rank order, into my chunk of x and of my slot
    in_place = xs.flags.c_contiguous
    flat = xs.reshape(-1) if in_place else np.empty(count, xs.dtype)
    lo, hi = _chunk(count, world, rank, xs.dtype.itemsize)
    _ordered_sum_into(flat[lo:hi], [piece(p, lo, hi) for p in range(world)])
    _slot(peers, rank, epoch, count, xs.dtype)[lo:hi] = flat[lo:hi]
    _store_flag(peers, DONE, epoch)
    # all-gather: every peer's reduced chunk
    for step in range(1, world):
        p = (rank + step) % world
        plo, phi = _chunk(count, world, p, xs.dtype.itemsize)
        _wait(peers, p, DONE, epoch)
        flat[plo:phi] = _slot(peers, p, epoch, count, xs.dtype)[plo:phi]
    if not in_place:
        np.copyto(xs, flat.reshape(m, n))


def _all_reduce(a, xs, chain=None):
    """all_reduce of xs [m, n] in place (None at one rank: nothing to move); returns RAD_LINK_ENDED/RAD_OK
    (gate ended) or an error."""
    peers = a.peers
    if _world(peers) == 1:
        if peers is not None:
            _next_epoch(peers)
        _wait_chain(chain)
        return _end_link(a)
    if xs.size * xs.dtype.itemsize > int(peers.buffer_bytes):
        return RAD_E_NOMEM  # every rank sees the same sizes, so every rank refuses alike
    epoch = _next_epoch(peers)
    _publish(peers, epoch, xs)
    _reduce(a, xs, epoch, chain)
    return _end_link(a)


# ---- the rows -----------------------------------------------------------------------------------

def all_reduce_host(a):
    """x = the sum of every rank's x in rank order; colour 2."""
    try:
        m, n = rad_args_geti(a, "M"), rad_args_geti(a, "n")
        return _all_reduce(a, _rows(a.t[0].data, m, n))
    except _Failed as failed:
        return failed.status


def all_reduce_host_r4dchain(a):
    """The chained all_reduce: publish my contribution, then wait in the prologue for
    a.chain.wait_word >= wait_value, reduce, then set a.chain.bump_word = bump_value; colour 2.
    Without a chain record it is all_reduce_host."""
    try:
        m, n = rad_args_geti(a, "M"), rad_args_geti(a, "n")
        status = _all_reduce(a, _rows(a.t[0].data, m, n), a.chain)
        if status in (RAD_OK, RAD_LINK_ENDED):
            _bump_chain(a.chain)
        return status
    except _Failed as failed:
        return failed.status


def all_gather_host(a):
    """y[:, r*n:(r+1)*n] = rank r's x [M, n]; colour 1 (its last peer read is its last act)."""
    try:
        m, n = rad_args_geti(a, "M"), rad_args_geti(a, "n")
        peers = a.peers
        world = _world(peers)
        xs = _rows(a.t[0].data, m, n)
        y = _rows(a.t[1].data, m, world * n)
        if world == 1:
            if peers is not None:
                _next_epoch(peers)
            np.copyto(y, xs)
            return RAD_OK
        if xs.size * xs.dtype.itemsize > int(peers.buffer_bytes):
            return RAD_E_NOMEM
        epoch = _next_epoch(peers)
        _publish(peers, epoch, xs)
        rank = peers.rank
        y[:, rank * n:(rank + 1) * n] = xs
        for step in range(1, world):
            p = (rank + step) % world
            _wait(peers, p, READY, epoch)
            y[:, p * n:(p + 1) * n] = _slot(peers, p, epoch, m * n, xs.dtype).reshape(m, n)
        return RAD_OK
    except _Failed as failed:
        return failed.status


def _ordered_row_sum(values):
    """Per row, ((v0 + v1) + v2) + ... in column order, in f32: add.accumulate is a sequential
    chain (no pairwise reduction), bit for bit libref's loop."""
    return np.cumsum(values, axis=-1, dtype=F32)[:, -1]


def rmsnorm_rows(x, w, eps, n, out):
    """libref's rmsnorm: y = (x * (1 / sqrt(sum(x*x) / n + eps))) * w, the sum in column order."""
    mean = _ordered_row_sum(x * x) / F32(n)
    scale = F32(1.0) / np.sqrt(mean + F32(eps))
    out[...] = (x * scale[:, None]) * np.asarray(w).reshape(-1)[None, :n]


_native_add_rmsnorm = None  # r4d.c's add + rmsnorm, when libr4d's native kernels are built


def use_native_add_rmsnorm(function) -> None:
    """Take libr4d's native tail (bit for bit libref's add then rmsnorm) for the fused row."""
    global _native_add_rmsnorm
    _native_add_rmsnorm = function


def all_reduce_add_rmsnorm_host(a):
    """x = all_reduce(x); residual = residual + x; y = rmsnorm(residual) * w, exactly the chain
    all_reduce + add + rmsnorm of libref's rows; colour 2: the gate ends before the add and the norm."""
    try:
        m, n = rad_args_geti(a, "M"), rad_args_geti(a, "n")
        eps = rad_args_getf(a, "eps")
        x, residual, w, y = (t.data for t in a.t[:4])
        status = _all_reduce(a, _rows(x, m, n) if _world(a.peers) > 1 else None)  # one rank: x stays
        if status not in (RAD_OK, RAD_LINK_ENDED):
            return status
        if _native_add_rmsnorm is not None and x.dtype == residual.dtype == y.dtype == F32:
            # The operands themselves, not views of them: the native side keys its argument packs
            # on the arrays a node passes every step.
            tail = _native_add_rmsnorm(residual, x, w, y, m, n, eps)
            return status if tail == RAD_OK else tail
        xs, rs, ys = _rows(x, m, n), _rows(residual, m, n), _rows(y, m, n)
        np.add(rs, xs, out=rs)
        rmsnorm_rows(rs, w, eps, n, ys)
        return status
    except _Failed as failed:
        return failed.status


# ---- the fused op's schema and the rows' declarations, for the library's export table -----------

FUSED_OP = "all_reduce_add_rmsnorm"
FUSED_REPLACES = "all_reduce(x)+add(residual,x,residual)+rmsnorm(residual,w,y)"
FUSED_SCHEMA = RadOpSchema(
    op=FUSED_OP,
    params=[RadParamSpec("M", RAD_P_INT, RAD_REQUIRED, RAD_PROLE_SEQ_CHUNK),
            RadParamSpec("n", RAD_P_INT, RAD_REQUIRED, RAD_PROLE_NONE),
            RadParamSpec("eps", RAD_P_F64, RAD_REQUIRED, RAD_PROLE_NONE),
            RadParamSpec("dtype", RAD_P_STR, RAD_REQUIRED, RAD_PROLE_NONE)],
    operands=[RadOperandSpec("x", RAD_OPD_INOUT, 0), RadOperandSpec("residual", RAD_OPD_INOUT, 0),
              RadOperandSpec("w", RAD_OPD_WEIGHT, 1), RadOperandSpec("y", RAD_OPD_OUT, 0)],
    doc="x = all_reduce(x) (rank order); residual = residual + x; y = rmsnorm(residual) * w",
)


def layout_f32(weight, encoding, geometry):
    """The fused row keeps its rmsnorm weight decoded to f32, as libref's rmsnorm does."""
    return RAD_OK


def relayout_f32(weight, geometry):
    return rad_weight_f32(weight)


def _host_row(name, op, launch, computes, priority=0, needs=(), **hooks):
    return RadKernelInfo(
        name=name, op=op, family="collective", computes=computes, shape="any", dtypes="f32 activations",
        domain=RAD_DOMAIN_HOST, priority=priority,
        constraints=[RAD_CEQ("device.p2p", 0), RAD_CEQ("dtype", "f32"), *needs], launch=launch, **hooks)


# Suggested declarations (the library's export table decides what it lists and in which order),
# each with its rad_kernel_collective colour: 2, the row ends the link-gate hold itself; 1, the
# engine ends it when the launch returns. A row whose name carries "r4dchain" is chained
# (rad_kernel_chain), as the engine requires the name and the flag to agree.
HOST_ROWS = [
    (_host_row("all_reduce_host", "all_reduce", all_reduce_host,
               "shared memory, rank-order sum, one-shot or reduce-scatter + all-gather"), 2),
    # above all_reduce_host where the engine launches chained rows with their records (device.chain
    # == 1, the default); with --no-chain all_reduce_host serves
    (_host_row("all_reduce_host_r4dchain", "all_reduce", all_reduce_host_r4dchain,
               "as all_reduce_host, waiting on its chain record in the prologue", priority=1,
               needs=(RAD_CEQ("device.chain", 1),)), 2),
    (_host_row("all_gather_host", "all_gather", all_gather_host, "shared memory"), 1),
    (_host_row("all_reduce_add_rmsnorm_host", FUSED_OP, all_reduce_add_rmsnorm_host,
               "rank-order all_reduce, residual add, ordered rmsnorm", layout=layout_f32, relayout=relayout_f32,
               replaces=FUSED_REPLACES), 2),
]
