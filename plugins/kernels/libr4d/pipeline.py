"""libr4d's pipeline rows: `send` and `recv` at a stage boundary the engine cut (docs/OPS.md), on
the host. Two pairs, exactly one of which matches any launch, by the measured fact
`device.same_host`:

- `send_shm` / `recv_shm` (device.same_host == 1): through the receiver's shared-memory pipe that
  the engine maps at both ends (RadArgs.peers: rank 0 sends, rank 1 receives, `buffers[0]` two
  slots, `flags[0]` READY, `flags[1]` DONE). Epoch e uses slot e & 1; the sender waits for
  DONE >= e - 2 before it writes the slot again, so it never overwrites rows not yet read;
- `send_link` / `recv_link` (device.same_host == 0): handed to the engine's link
  (RadArgs.peers.link: send and recv of a contiguous array, in order), which reaches the other host.

Each moves x[M, n] whole; they import nothing of radiance's but radiance.abi."""

import os

import numpy as np

from radiance.abi import (
    RAD_CEQ, RAD_DOMAIN_HOST, RAD_E_DEVICE, RAD_E_NOMEM, RAD_E_SHAPE, RAD_E_UNSUPPORTED, RAD_OK, RadKernelInfo,
    rad_args_geti, rad_wait_word,
)

WAIT_TIMEOUT_NS = int(float(os.environ.get("RADIANCE_COLLECTIVE_TIMEOUT_S", "120")) * 1e9)
READY, DONE = 0, 1  # RadPeers.flags of a pipe: the sender's word, the receiver's


def _rows(a):
    """The [M, n] rows of the operand, or None where it holds fewer."""
    m, n = rad_args_geti(a, "M"), rad_args_geti(a, "n")
    data = a.t[0].data
    if data.ndim != 2 or data.shape[0] < m or data.shape[1] != n:
        return None
    return data[:m]


def _slot(peers, epoch, rows):
    offset = (epoch & 1) * int(peers.buffer_bytes)
    return peers.buffers[0][offset:offset + rows.nbytes].view(rows.dtype).reshape(rows.shape)


def send_shm(a):
    rows, peers = _rows(a), a.peers
    if rows is None:
        return RAD_E_SHAPE
    if peers is None or not peers.buffers:
        return RAD_E_UNSUPPORTED
    if rows.nbytes > int(peers.buffer_bytes):
        return RAD_E_NOMEM
    peers.epoch = epoch = int(peers.epoch) + 1
    if epoch > 2 and rad_wait_word(peers.flags[DONE], epoch - 2, WAIT_TIMEOUT_NS) != RAD_OK:
        return RAD_E_DEVICE
    np.copyto(_slot(peers, epoch, rows), rows)
    peers.flags[READY][0] = epoch  # x86 stores are seen in program order: the rows before the word
    return RAD_OK


def recv_shm(a):
    rows, peers = _rows(a), a.peers
    if rows is None:
        return RAD_E_SHAPE
    if peers is None or not peers.buffers:
        return RAD_E_UNSUPPORTED
    if rows.nbytes > int(peers.buffer_bytes):
        return RAD_E_NOMEM
    peers.epoch = epoch = int(peers.epoch) + 1
    if rad_wait_word(peers.flags[READY], epoch, WAIT_TIMEOUT_NS) != RAD_OK:
        return RAD_E_DEVICE
    np.copyto(rows, _slot(peers, epoch, rows))
    peers.flags[DONE][0] = epoch
    return RAD_OK


def send_link(a):
    rows, peers = _rows(a), a.peers
    if rows is None:
        return RAD_E_SHAPE
    if peers is None or peers.link is None or peers.link.send is None:
        return RAD_E_UNSUPPORTED
    peers.epoch = int(peers.epoch) + 1
    return peers.link.send(np.ascontiguousarray(rows))


def recv_link(a):
    rows, peers = _rows(a), a.peers
    if rows is None:
        return RAD_E_SHAPE
    if peers is None or peers.link is None or peers.link.recv is None:
        return RAD_E_UNSUPPORTED
    peers.epoch = int(peers.epoch) + 1
    return peers.link.recv(rows)


def _row(name, op, launch, same_host, computes):
    return RadKernelInfo(name=name, op=op, family="pipeline", computes=computes, shape="any", dtypes="any",
                         domain=RAD_DOMAIN_HOST, constraints=[RAD_CEQ("device.same_host", same_host)], launch=launch)


# (declaration, rad_kernel_collective colour): the engine ends the link-gate hold at return.
HOST_ROWS = [
    (_row("send_shm", "send", send_shm, 1, "x into the next stage's shared-memory pipe"), 1),
    (_row("recv_shm", "recv", recv_shm, 1, "y out of this rank's shared-memory pipe"), 1),
    (_row("send_link", "send", send_link, 0, "x to the next stage's host, through the engine's link"), 1),
    (_row("recv_link", "recv", recv_link, 0, "y from the previous stage's host, through the engine's link"), 1),
]
