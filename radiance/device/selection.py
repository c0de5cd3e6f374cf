"""Which backend a rank uses: chosen by the card the launcher gave it, never by what is installed.

The launcher pins each card rank to one card: CUDA_VISIBLE_DEVICES on NVIDIA, ROCR_VISIBLE_DEVICES
on AMD (with HIP_/CUDA_VISIBLE_DEVICES unset), nothing on a host rank. A backend module, and so
its GPU library, is imported only here and only for the vendor named, so a host rank never
imports cuda-bindings, hip-python or torch.
"""

from __future__ import annotations

import importlib
import os
from typing import Mapping

BACKENDS = {"cuda": "radiance.device.cuda", "hip": "radiance.device.hip",
            "fake": "radiance.device.fake"}
HIDDEN = ("", "-1", "none", "NoDevFiles")  # values that hide every card
# For tests only: the launcher gives a rank fake card N (fake.py) for RADIANCE_TEST_FAKE_CARDS.
FAKE_CARD = "RADIANCE_TEST_FAKE_CARD"


def _visible(value: str | None) -> bool:
    return value is not None and value.strip() not in HIDDEN


def backend_name(environ: Mapping[str, str] | None = None) -> str | None:
    """"cuda", "hip", "fake" (tests) or None (a host rank) from the rank's pinning variables."""
    env = os.environ if environ is None else environ
    rocr, cuda = env.get("ROCR_VISIBLE_DEVICES"), env.get("CUDA_VISIBLE_DEVICES")
    if env.get(FAKE_CARD) is not None:
        if _visible(rocr) or _visible(cuda):
            raise ValueError(f"{FAKE_CARD} (a fake card, for tests) is set beside a real card's visibility "
                             "variable: a rank is pinned to one card")
        return "fake"
    if _visible(rocr) and _visible(cuda):
        # On AMD the launcher unsets CUDA_VISIBLE_DEVICES (HIP honours it too), so both at once
        # is a rank started by hand that names cards of two vendors.
        raise ValueError(f"both ROCR_VISIBLE_DEVICES={rocr!r} and CUDA_VISIBLE_DEVICES={cuda!r} are set: "
                         "a rank is pinned to one card, by one of them")
    if _visible(rocr):
        return "hip"
    if _visible(cuda):
        return "cuda"
    return None


def open_device(environ: Mapping[str, str] | None = None, **options):
    """The Device for this rank's card (ordinal 0 of what it sees), or None on a host rank."""
    name = backend_name(environ)
    if name is None:
        return None
    module = importlib.import_module(BACKENDS[name])
    return module.open_device(**options)
