"""libr4d's device collectives (domain RAD_DOMAIN_DEVICE), colour 2: all_reduce and all_gather on
f32 activations, each as a P2P row (device.p2p == 1) and its `_host` twin (device.p2p == 0).

The kernels are allreduce.cu's (libr4d/device); the engine object in RadArgs.peers (DevicePeers,
collectives/device_peers.py) owns the regions they move bytes through and launches them: over the
peers' card memory opened by IPC handle in the P2P form, over POSIX shared memory mapped on every
card in the host-staged one. A row reads, per launch:

    a.t[0].data, a.t[1].data   int device addresses (row-major; shape[0] = the step's rows M)
    params "n"                 the row length
    a.stream                   the engine's RadStream (EngineStream): the launch is queued on it
    a.peers                    the DevicePeers (None: one rank)
    a.link_gate                int device address of this rank's mapped link-gate word, or 0/None

and returns RAD_LINK_ENDED when a gate was given (the kernel stores 0 there once its peers' bytes
have landed), RAD_OK without one. Nothing here allocates or waits: a launch may be captured.
Imports nothing of radiance's but radiance.abi (tests/test_packaging.py).
"""

from radiance.abi import (
    RAD_CEQ, RAD_DOMAIN_DEVICE, RAD_E_NOMEM, RAD_E_SHAPE, RAD_FACT_P2P, RAD_LINK_ENDED, RAD_OK, RadKernelInfo,
    rad_args_geti,
)

F32_BYTES = 4


def _geometry(a, operands):
    """(M, n, addresses) of the f32 operands: 2-D, row-major, contiguous, `width * n` elements a row."""
    n = rad_args_geti(a, "n")
    m = int(a.t[0].shape[0])
    addresses = []
    for index, width in operands:
        t = a.t[index]
        row = width * n
        if int(t.ndim) != 2 or int(t.shape[0]) < m or int(t.shape[1]) != row or int(t.pitch[0]) != row * F32_BYTES:
            raise ValueError(f"operand {index}: not a contiguous [{m}, {row}] f32 tensor")
        addresses.append(int(t.data))
    return m, n, addresses


def _gate(a):
    return int(a.link_gate or 0)


def _ended(gate):
    return RAD_LINK_ENDED if gate else RAD_OK


def _end_without_peers(a, gate):
    """One rank: no kernel moves anything, the stream still ends the gate hold."""
    if gate:
        a.stream.memset32(gate, 0, 2)
    return _ended(gate)


def all_reduce_device(a):
    """x = the sum of every rank's x in rank order (one-shot or two-shot kernel by size); colour 2."""
    try:
        m, n, (x,) = _geometry(a, [(0, 1)])
    except ValueError:
        return RAD_E_SHAPE
    peers, gate = a.peers, _gate(a)
    if peers is None or int(peers.world_size) == 1:
        return _end_without_peers(a, gate)
    if m * n * F32_BYTES > int(peers.buffer_bytes):
        return RAD_E_NOMEM  # every rank sees the same sizes, so every rank refuses alike
    try:
        peers.all_reduce(a.stream, x, x, m * n, gate)
    except ValueError:
        return RAD_E_SHAPE
    return _ended(gate)


def all_gather_device(a):
    """y[:, r*n:(r+1)*n] = rank r's x [M, n]; colour 2 (the kernel ends the gate hold)."""
    peers, gate = a.peers, _gate(a)
    world = 1 if peers is None else int(peers.world_size)
    try:
        m, n, (x, y) = _geometry(a, [(0, 1), (1, world)])
    except ValueError:
        return RAD_E_SHAPE
    if world == 1:
        a.stream.copy(y, x, m * n * F32_BYTES)
        return _end_without_peers(a, gate)
    if m * n * F32_BYTES > int(peers.buffer_bytes):
        return RAD_E_NOMEM
    try:
        peers.all_gather(a.stream, x, y, m, n, gate)
    except ValueError:
        return RAD_E_SHAPE
    return _ended(gate)


def _device_row(name, op, launch, p2p, computes):
    return RadKernelInfo(
        name=name, op=op, family="collective", computes=computes, shape="any", dtypes="f32 activations",
        domain=RAD_DOMAIN_DEVICE, priority=0, constraints=[RAD_CEQ(RAD_FACT_P2P, p2p), RAD_CEQ("dtype", "f32")],
        launch=launch)


# As collectives.py's HOST_ROWS: each declaration with its rad_kernel_collective colour, 2 for
# every one (the kernel ends the hold once its peers' bytes have landed); none is chained.
DEVICE_ROWS = [
    (_device_row("all_reduce_p2p", "all_reduce", all_reduce_device, 1,
                 "device kernel over the peers' card memory (IPC), rank-order sum, one-shot or two-shot"), 2),
    (_device_row("all_reduce_p2p_host", "all_reduce", all_reduce_device, 0,
                 "the same kernel over shared memory mapped on every card (PCIe), rank-order sum"), 2),
    (_device_row("all_gather_p2p", "all_gather", all_gather_device, 1,
                 "device kernel over the peers' card memory (IPC)"), 2),
    (_device_row("all_gather_p2p_host", "all_gather", all_gather_device, 0,
                 "the same kernel over shared memory mapped on every card (PCIe)"), 2),
]
