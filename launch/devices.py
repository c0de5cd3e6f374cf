"""The cards a launch may use, read from the machine and narrowed by the user's visibility
variables, each by its own rules: ROCR_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES (AMD, applied in
that order, indices or UUIDs) and CUDA_VISIBLE_DEVICES (NVIDIA, indices or GPU- UUIDs; the list
ends at the first entry that names no card, as CUDA's does)."""

import os
from dataclasses import dataclass
from pathlib import Path

KFD_NODES = Path("/sys/class/kfd/kfd/topology/nodes")
NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")
# For tests only (a user never sets these): RADIANCE_TEST_FAKE_CARDS=N makes the machine show N
# fake cards in place of its own, and a rank pinned to fake card i gets RADIANCE_TEST_FAKE_CARD=i
# (radiance/device/fake.py's backend). CI launches "card" ranks this way on a machine without cards.
FAKE_CARDS = "RADIANCE_TEST_FAKE_CARDS"
FAKE_CARD = "RADIANCE_TEST_FAKE_CARD"


@dataclass(frozen=True)
class Card:
    vendor: str  # "amd" or "nvidia"
    index: int  # the runtime's index before any visibility variable
    uuid: str
    arch: str  # gfx target or "nvidia"
    integrated: bool
    bus_id: str = ""


def _amd_cards() -> list[Card]:
    cards = []
    if not KFD_NODES.is_dir():
        return cards
    for node in sorted(KFD_NODES.iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else 0):
        try:
            props = dict(line.split() for line in (node / "properties").read_text().splitlines() if line.strip())
        except (OSError, ValueError):
            continue
        if int(props.get("simd_count", 0)) == 0:
            continue  # a CPU node
        version = int(props.get("gfx_target_version", 0))
        arch = f"gfx{version // 10000}{(version // 100) % 100:x}{version % 100:x}" if version else "gfx"
        cards.append(Card("amd", len(cards), props.get("unique_id", str(len(cards))), arch,
                          integrated=int(props.get("cpu_cores_count", 0)) > 0))
    return cards


def _nvidia_cards() -> list[Card]:
    cards = []
    if not NVIDIA_GPUS.is_dir():
        return cards
    for index, gpu in enumerate(sorted(NVIDIA_GPUS.iterdir())):
        info = {}
        try:
            for line in (gpu / "information").read_text().splitlines():
                key, _, value = line.partition(":")
                info[key.strip()] = value.strip()
        except OSError:
            pass
        cards.append(Card("nvidia", index, info.get("GPU UUID", str(index)), "nvidia",
                          integrated=False, bus_id=gpu.name))
    return cards


def _narrow(cards: list[Card], variable: str, stop_at_unknown: bool) -> list[Card]:
    text = os.environ.get(variable)
    if text is None:
        return cards
    chosen = []
    for entry in (part.strip() for part in text.split(",") if part.strip()):
        match = [c for c in cards if entry == str(cards.index(c)) or entry == c.uuid or
                 (entry.startswith("GPU-") and c.uuid.startswith(entry))]
        if not match:
            if stop_at_unknown:
                break
            raise ValueError(f"{variable}={text}: '{entry}' names no card")
        if match[0] not in chosen:
            chosen.append(match[0])
    return chosen


def _fake_cards() -> list[Card] | None:
    text = os.environ.get(FAKE_CARDS)
    if text is None:
        return None
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{FAKE_CARDS}={text}: a count of fake cards (for tests), not {text!r}")
    return [Card("fake", index, f"FAKE-{index}", "fake", integrated=False) for index in range(int(text))]


def visible_cards() -> list[Card]:
    """The cards a launch may use: discrete ones if any (all of the first one's architecture),
    integrated ones only when there is nothing else; the fake ones alone when a test asks."""
    fake = _fake_cards()
    if fake is not None:
        return fake
    amd = _narrow(_narrow(_amd_cards(), "ROCR_VISIBLE_DEVICES", False), "HIP_VISIBLE_DEVICES", False)
    nvidia = _narrow(_nvidia_cards(), "CUDA_VISIBLE_DEVICES", True)
    cards = amd + nvidia
    discrete = [card for card in cards if not card.integrated]
    if discrete:
        return [card for card in discrete if card.arch == discrete[0].arch and card.vendor == discrete[0].vendor]
    return cards


def pin(card: Card | None, environment: dict) -> dict:
    """The environment of a rank that sees exactly this card (or none)."""
    environment = dict(environment)
    environment.pop(FAKE_CARD, None)
    if card is None or card.vendor == "fake":
        for variable in ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
            environment.pop(variable, None)
        if card is not None:
            environment[FAKE_CARD] = str(card.index)
    elif card.vendor == "amd":
        environment["ROCR_VISIBLE_DEVICES"] = card.uuid if card.uuid.startswith("GPU-") else str(card.index)
        environment.pop("HIP_VISIBLE_DEVICES", None)
        environment.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        environment["CUDA_VISIBLE_DEVICES"] = card.uuid if card.uuid.startswith("GPU-") else str(card.index)
    return environment


VISIBILITY = ("ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def pin_this_process(environ=None) -> Card | None:
    """For one rank in process (`radiance`, TP 1): pin this process to the first card it may use,
    unless a visibility variable already names exactly one, before any GPU library starts. The
    card chosen, or None (no card, or one named already)."""
    environ = os.environ if environ is None else environ
    named = [environ.get(variable, "") for variable in VISIBILITY]
    if any(value and value != "-1" and "," not in value for value in named) or FAKE_CARD in environ:
        return None  # the user (or a launcher) chose the card
    cards = visible_cards()
    if not cards:
        return None
    pinned = pin(cards[0], {variable: environ[variable] for variable in VISIBILITY if variable in environ})
    for variable in (*VISIBILITY, FAKE_CARD):
        environ.pop(variable, None)
    environ.update(pinned)
    return cards[0]
