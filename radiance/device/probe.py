"""The device.p2p fact, measured: a real write and read-back through IPC handles with every peer.

Drivers misreport peer access, and a rank pinned to one card reaches its peers only through IPC
handles, so the fact is what actually happened: each rank exports a probe buffer, opens every
peer's, writes a pattern into the peer's slot for it, reads it back through the mapping, and then
checks what its peers wrote into its own buffer. P2P holds with a peer only when both directions
agree, and the rank's fact holds only when it holds with every peer (the coordinator then combines
the ranks' facts the same way).

`exchange(payload: bytes) -> list[bytes]` is the caller's all-gather (one payload per rank, in rank
order); it is also the barrier between writing and checking. ranks/facts.py supplies it.
"""

from __future__ import annotations

import json
from typing import Callable

import numpy as np

from .base import Device

SLOT_BYTES = 64 * 1024
ROUNDS = 4  # the exchanges of a probe with peers


def probe_rounds(world: int) -> int:
    """How many times probe_p2p calls `exchange` in a world of `world` ranks: none for one rank,
    which has no peer to probe (the launcher's handshake relays exactly this many rounds)."""
    return ROUNDS if world > 1 else 0


def pattern(writer: int, owner: int, nbytes: int = SLOT_BYTES) -> np.ndarray:
    """The bytes `writer` puts into `owner`'s buffer: distinct per pair and per position."""
    return ((np.arange(nbytes, dtype=np.uint32) * 2654435761 + writer * 97 + owner * 13) >> 7).astype(np.uint8)


def probe_p2p(device: Device, rank: int, world: int, exchange: Callable[[bytes], list[bytes]],
              slot_bytes: int = SLOT_BYTES) -> dict:
    """{"device.p2p": 0 or 1, "peers": {peer: True/False}, "detail": why, per failing peer}.

    Every rank calls `exchange` exactly four times whatever fails, so no rank waits for a peer
    that gave up: a failure is reported as the answer "no P2P" with its reason."""
    if probe_rounds(world) == 0:
        return {"device.p2p": 1, "peers": {}, "detail": "no peers"}
    peers = [p for p in range(world) if p != rank]
    ok, why, opened, mine, handle = {p: False for p in peers}, {}, {}, None, b""
    try:
        mine = device.alloc(world * slot_bytes, "p2p probe")
        device.copy_to_device(mine, np.zeros(world * slot_bytes, np.uint8))
        device.synchronize()
        handle = device.export_handle(mine)
    except Exception as error:  # noqa: BLE001  (the fact is "no", with the reason)
        why.update({p: f"this rank could not export a buffer: {type(error).__name__}: {error}" for p in peers})
    handles = exchange(handle)                                               # 1: handles
    for peer in peers:
        if not handle or not handles[peer]:
            why.setdefault(peer, f"rank {peer} exported no buffer")
            continue
        try:
            opened[peer] = device.open_handle(handles[peer], world * slot_bytes, f"p2p probe of rank {peer}")
            expected = pattern(rank, peer, slot_bytes)
            slot = opened[peer].ptr + rank * slot_bytes
            device.copy_to_device(slot, expected)
            back = np.empty(slot_bytes, np.uint8)
            device.copy_to_host(back, slot)
            device.synchronize()
            ok[peer] = bool(np.array_equal(back, expected))
            if not ok[peer]:
                why[peer] = f"read back through rank {peer}'s IPC mapping differs at byte {int(np.argmax(back != expected))}"
        except Exception as error:  # noqa: BLE001  (a handle that does not open means no P2P)
            why[peer] = f"{type(error).__name__}: {error}"
    exchange(b"written")                                                     # 2: every write is done
    if mine is not None:
        landed = np.empty(world * slot_bytes, np.uint8)
        device.copy_to_host(landed, mine)
        device.synchronize()
        for peer in peers:
            got = landed[peer * slot_bytes:(peer + 1) * slot_bytes]
            if ok[peer] and not np.array_equal(got, pattern(peer, rank, slot_bytes)):
                ok[peer], why[peer] = False, f"rank {peer}'s write did not land in this rank's buffer"
    verdicts = exchange(json.dumps({str(p): v for p, v in ok.items()}).encode())  # 3: both directions
    for peer in peers:
        if ok[peer] and not json.loads(verdicts[peer]).get(str(rank), False):
            ok[peer], why[peer] = False, f"rank {peer} could not reach this rank"
    for allocation in opened.values():
        device.close_handle(allocation)
    exchange(b"closed")                                                      # 4: no peer still maps ours
    if mine is not None:
        device.free(mine)
    holds = all(ok.values())
    detail = "P2P with every peer" if holds else "; ".join(f"rank {p}: {w}" for p, w in sorted(why.items()))
    return {"device.p2p": int(holds), "peers": ok, "detail": detail}
