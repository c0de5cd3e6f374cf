"""Which libraries' device code runs on this card. A kernel library names what its device code is
built for in RadPluginInfo.build_target: words such as `host`, a vendor (`cuda`, `hip`: source
compiled at run time for whatever card of that vendor) or exact targets (`sm_90`, `gfx942`). On a
card whose vendor and target it does not name, the library is left out, not failed: its device rows
leave selection, its host rows stay, and the log says what it carries against what the card runs."""

from __future__ import annotations

from radiance.abi import RAD_DOMAIN_DEVICE


def runs_on(build_target: str, vendor: str, target: str) -> bool:
    words = (build_target or "").split()
    base = target.split(":")[0]  # gfx942:sramecc+:xnack- -> gfx942
    return vendor in words or target in words or base in words


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
