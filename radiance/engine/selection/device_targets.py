"""Which libraries' device code runs on this card. A kernel library names what its device code is
built for in RadPluginInfo.build_target: words such as `host`, a vendor (`cuda`, `hip`: source
compiled at run time for whatever card of that vendor), exact targets (`sm_90`, `gfx942`) or an AMD
family's generic target (`gfx10-3-generic` runs on gfx1030..gfx1036), separated by spaces or commas. On a
card whose vendor and target it does not name, the library is left out, not failed: its device rows
leave selection, its host rows stay, and the log says what it carries against what the card runs."""

from __future__ import annotations

import re

from radiance.abi import RAD_DOMAIN_DEVICE


# AMD's generic targets and the chips a code object built for each runs on (LLVM's AMDGPU usage)
FAMILIES = {
    "gfx9-generic": ("gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"),
    "gfx9-4-generic": ("gfx940", "gfx941", "gfx942", "gfx950"),
    "gfx10-1-generic": ("gfx1010", "gfx1011", "gfx1012", "gfx1013"),
    "gfx10-3-generic": ("gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036"),
    "gfx11-generic": ("gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153"),
    "gfx12-generic": ("gfx1200", "gfx1201"),
}
FAMILY_OF = {chip: family for family, chips in FAMILIES.items() for chip in chips}


def accepted_targets(target: str) -> list[str]:
    """What a card accepts, best first: the target with its modes, the chip, then the chip's
    family (`gfx1036:xnack-`, `gfx1036`, `gfx10-3-generic`)."""
    chip = target.split(":")[0]  # gfx942:sramecc+:xnack- -> gfx942
    return list(dict.fromkeys([target, chip] + ([FAMILY_OF[chip]] if chip in FAMILY_OF else [])))


def runs_on(build_target: str, vendor: str, target: str) -> bool:
    """Whether device code built for `build_target` (words separated by spaces or commas) runs on
    this card: its vendor named (source compiled at run time), or a target it accepts."""
    words = set(re.split(r"[\s,]+", build_target or "")) - {""}
    return vendor in words or any(accepted in words for accepted in accepted_targets(target))


def leave_out_foreign_device_code(registry, vendor: str, target: str, log=None) -> list[str]:
    """Drop the device rows of every library whose device code does not run on this card; the
    names of the libraries left out."""
    left_out = []
    for library in registry.hierarchy:
        device_rows = [row for row in library.rows if row.info.domain == RAD_DOMAIN_DEVICE]
        if not device_rows or runs_on(library.info.build_target, vendor, target):
            continue
        library.rows = [row for row in library.rows if row.info.domain != RAD_DOMAIN_DEVICE]
        left_out.append(library.name)
        if log is not None:
            log.info("%s (%s): device code built for '%s', this card runs %s %s: its %d device rows leave "
                     "selection, its host rows stay", library.name, library.path, library.info.build_target,
                     vendor, target, len(device_rows))
    return left_out
