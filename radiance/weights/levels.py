"""What the core schemes accept: the planes of a `plain` or `affine` encoding, their kinds and types,
and the scale and minimum levels in order (`scale`, `scale.1`, `scale.2`, ...; `min`, `min.1`, ...).

`plain` is codes (through an optional grid or table), signs and scale levels; `affine` may add a
zero and minimum levels. Any other scheme is a quantiser's own, decoded by its plugin's hook.
"""

import re

from radiance.abi import (
    BITS, NAMES, RAD_DT_U1, RAD_MAX_PLANES, RAD_PLANE_TABLE, RAD_PLANE_TILED, RadEncoding,
)

from .planes import element_dtype
from . import givens
from .transforms import PERM

CORE_SCHEMES = ("plain", "affine")
TABLE_PLANES = ("grid", "table", PERM) + givens.PLANES
TRANSFORM_PLANES = {PERM: "perm", **{plane: "givens" for plane in givens.PLANES}}  # plane -> its transform
_LEVEL = re.compile(r"^(scale|min)(?:\.([1-9][0-9]*))?$")


def levels(encoding: RadEncoding, base: str, name: str = "weight") -> list:
    """The planes of the `base` levels ("scale" or "min"), level 0 first; a gap is refused."""
    found = {}
    for plane in encoding.planes:
        match = _LEVEL.match(plane.name)
        if match and match.group(1) == base:
            found[int(match.group(2) or 0)] = plane
    if sorted(found) != list(range(len(found))):
        names = ", ".join(repr(found[level].name) for level in sorted(found))
        raise ValueError(f"{name}: the {base} levels {names} skip a level "
                         f"(they run {base!r}, '{base}.1', '{base}.2', ...)")
    return [found[level] for level in range(len(found))]


def _check_plane(encoding: RadEncoding, plane, name: str) -> None:
    label = f"{name}: plane {plane.name!r}"
    known = plane.name in ("codes", "signs", "zero") + TABLE_PLANES or _LEVEL.match(plane.name)
    if not known or TRANSFORM_PLANES.get(plane.name, encoding.transform) != encoding.transform:
        raise ValueError(f"{label} is not part of the {encoding.scheme!r} scheme "
                         f"(transform {encoding.transform!r})")
    if plane.dtype not in BITS:
        raise ValueError(f"{label}: unknown dtype {plane.dtype}")
    kind = RAD_PLANE_TABLE if plane.name in TABLE_PLANES else RAD_PLANE_TILED
    if plane.kind != kind:
        raise ValueError(f"{label} must be {'TABLE' if kind == RAD_PLANE_TABLE else 'TILED'}")
    if plane.name in givens.INTEGER_PLANES and element_dtype(plane).kind not in "iu":
        raise ValueError(f"{label} must be integers, not {NAMES[plane.dtype]}")
    if plane.name == "signs" and plane.dtype != RAD_DT_U1:
        raise ValueError(f"{label} must be u1, not {NAMES[plane.dtype]}")
    if encoding.scheme == "plain" and (plane.name == "zero" or plane.name.startswith("min")):
        raise ValueError(f"{label}: a 'plain' encoding has no zero or minimum (that is 'affine')")


def _check_codes(encoding: RadEncoding, name: str) -> None:
    codes, grid, table = (encoding.plane(plane) for plane in ("codes", "grid", "table"))
    if codes is None:
        raise ValueError(f"{name}: the encoding has no 'codes' plane")
    if grid and table:
        raise ValueError(f"{name}: the encoding has both a 'grid' and a 'table'; codes index one")
    if encoding.vec < 1 or (encoding.vec > 1 and not grid):
        raise ValueError(f"{name}: vec {encoding.vec} needs a 'grid' plane [entries x {encoding.vec}]")
    if grid and grid.cols != encoding.vec:
        raise ValueError(f"{name}: plane 'grid' is [{grid.rows}x{grid.cols}], its columns must be "
                         f"vec = {encoding.vec}")
    if table and table.rows != 1:
        raise ValueError(f"{name}: plane 'table' is [{table.rows}x{table.cols}], it must be one row")
    if (codes.block_rows, codes.block_cols) != (1, encoding.vec):
        raise ValueError(f"{name}: plane 'codes' has block [{codes.block_rows}x{codes.block_cols}], "
                         f"it must be [1x{encoding.vec}]")
    if (grid or table) and element_dtype(codes).kind != "u":
        raise ValueError(f"{name}: plane 'codes' is {NAMES[codes.dtype]}; codes that index a "
                         f"grid or table must be unsigned integers")


def check_encoding(encoding: RadEncoding, name: str = "weight") -> None:
    """Refuse, naming the weight and the plane, an encoding the core decoder cannot decode."""
    if encoding.scheme not in CORE_SCHEMES:
        raise ValueError(f"{name}: scheme {encoding.scheme!r} is a quantiser's own; its plugin's "
                         f"decode hook decodes it, the core decodes only 'plain' and 'affine'")
    planes = list(encoding.planes)
    names = [plane.name for plane in planes]
    if len(planes) > RAD_MAX_PLANES or encoding.n_planes != len(planes):
        raise ValueError(f"{name}: n_planes {encoding.n_planes} for {len(planes)} planes "
                         f"(at most {RAD_MAX_PLANES})")
    duplicates = sorted({plane for plane in names if names.count(plane) > 1})
    if duplicates:
        raise ValueError(f"{name}: plane {duplicates[0]!r} appears more than once")
    for plane in planes:
        _check_plane(encoding, plane, name)
    _check_codes(encoding, name)
    levels(encoding, "scale", name)
    levels(encoding, "min", name)
    if encoding.transform == "perm" and encoding.plane(PERM) is None:
        raise ValueError(f"{name}: transform 'perm' needs a TABLE plane {PERM!r}")
    if encoding.transform == "givens" and encoding.plane(givens.DENSE) is None and not (
            encoding.plane(givens.PAIRS) and encoding.plane(givens.ANGLE)):
        raise ValueError(f"{name}: transform 'givens' needs TABLE planes {givens.PAIRS!r} and {givens.ANGLE!r}, "
                         f"or {givens.DENSE!r}")
