"""What a rank measures about its card: device.p2p (a real write/read-back through IPC handles
with every peer, radiance/device/probe.py; 0 on a host rank, which has no card), device.arch,
device.integrated, and the card's PCI bus id, so the launch can show each rank is on the card it
was given."""

from collections.abc import Callable

HOST_FACTS = {"device.p2p": 0, "card": False, "device.arch": "host", "device.integrated": 0}


def measure_facts(rank: int, world: int, exchange: Callable[[bytes], list[bytes]] | None) -> dict:
    """`exchange` is the launch's all-gather (None on a host rank, which probes nothing)."""
    if exchange is None:
        return dict(HOST_FACTS)
    from radiance.device.probe import probe_p2p
    from radiance.device.selection import open_device

    device = open_device()
    try:
        probed = probe_p2p(device, rank, world, exchange)
        return {"device.p2p": int(probed["device.p2p"]), "card": True, "p2p_detail": probed.get("detail", ""),
                "device.arch": device.target, "device.integrated": int(device.integrated),
                "bus_id": getattr(device, "bus_id", ""), "name": getattr(device, "name", device.vendor)}
    finally:
        device.close()
