"""What a rank measures about its card: device.p2p (a real write/read-back through IPC handles
with every peer, radiance/device/probe.py; 0 on a host rank, which has no card), device.arch,
device.integrated, device.chain (whether its executor launches chained rows chained), and the card's
PCI bus id, so the launch can show each rank is on the card it was given."""

from collections.abc import Callable

HOST_FACTS = {"device.p2p": 0, "card": False, "device.arch": "host", "device.integrated": 0}


def chain_fact(chain: bool, device=None) -> int:
    """device.chain: 1 where this rank's executor launches r4dchain rows chained, each handed the
    chain record it waits on in its prologue: the host executor always can, a card with programmatic
    dependent launch can (radiance/engine/running/device.py); --no-chain (config.chain False) says 0.
    A row that needs it (libr4d's all_reduce_host_r4dchain) is selected only where it holds."""
    return int(chain and (device is None or device.programmatic_launch))


def measure_facts(rank: int, world: int, exchange: Callable[[bytes], list[bytes]] | None, chain: bool = True) -> dict:
    """`exchange` is the launch's all-gather (None on a host rank, which probes nothing); `chain`:
    config.chain (device.chain)."""
    if exchange is None:
        return {**HOST_FACTS, "device.chain": chain_fact(chain)}
    from radiance.device.probe import probe_p2p
    from radiance.device.selection import open_device

    device = open_device()
    try:
        probed = probe_p2p(device, rank, world, exchange)
        return {"device.p2p": int(probed["device.p2p"]), "card": True, "p2p_detail": probed.get("detail", ""),
                "device.arch": device.target, "device.integrated": int(device.integrated),
                "device.chain": chain_fact(chain, device),
                "bus_id": getattr(device, "bus_id", ""), "name": getattr(device, "name", device.vendor)}
    finally:
        device.close()
