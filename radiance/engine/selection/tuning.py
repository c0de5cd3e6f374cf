"""Tunables: a row's instantiation axes (`RadTunable`: a name, its legal values, a default), the
cross product of them the tuner measures, and the cache `rad-tune` writes and selection reads.

A band whose winner declares tunables gets a point in its resolved geometry, so the row reads it as
an ordinary parameter (`rad_args_geti(a, "aq")`): the point rad-tune measured fastest for this row
at this geometry with an extent inside the band, else the row's defaults.

The cache is JSON, `$RADIANCE_TUNE_CACHE`, else `~/.cache/radiance/tuned.json` ($RADIANCE_CACHE or
$XDG_CACHE_HOME moves it as they move the converter's cache): {"library:row": [entry, ...]}, an
entry {"geometry": the op's parameters but the ranged extent, "extent": the extent measured at,
"point": {name: value}, "us": {point as text: µs per launch}, "default": text}."""

import itertools
import json
import os
from pathlib import Path

from radiance.abi import RAD_DERIVED

_LOADED: dict = {}  # path -> (mtime_ns, entries)


def cache_path() -> Path:
    named = os.environ.get("RADIANCE_TUNE_CACHE")
    if named:
        return Path(named)
    root = os.environ.get("RADIANCE_CACHE")
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "radiance"
    return Path(root) / "tuned.json"


def values_of(tunable) -> list[int]:
    return [int(v) for v in tunable.values.replace(",", " ").split()]


def default_point(row) -> dict:
    return {t.name: int(t.deflt) for t in row.info.tunables}


def points(row) -> list[dict]:
    """The cross product of the row's tunables, the default first."""
    names = [t.name for t in row.info.tunables]
    every = [dict(zip(names, combo)) for combo in itertools.product(*(values_of(t) for t in row.info.tunables))]
    first = default_point(row)
    return [first] + [p for p in every if p != first]


def spell(point: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def key_of(row) -> str:
    return f"{row.plugin.name}:{row.name}"


def shape_key(schema, geometry: dict) -> dict:
    """The parameters a tuned point is kept for: all but the ranged extent and derived ones."""
    return {p.name: geometry[p.name] for p in schema.params[1:] if p.req != RAD_DERIVED and p.name in geometry}


def read(path: Path | None = None) -> dict:
    path = path or cache_path()
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        return {}
    cached = _LOADED.get(path)
    if cached and cached[0] == mtime:
        return cached[1]
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        entries = {}
    entries = entries if isinstance(entries, dict) else {}
    _LOADED[path] = (mtime, entries)
    return entries


def tuned_point(row, schema, geometry: dict, lo: int, hi: int) -> tuple[dict, str]:
    """(the point for this band, how it was chosen, in words)."""
    if not row.info.tunables:
        return {}, ""
    wanted = shape_key(schema, geometry)
    names = {t.name for t in row.info.tunables}
    for entry in read().get(key_of(row), []):
        point = entry.get("point", {})
        if (entry.get("geometry") == wanted and lo <= int(entry.get("extent", -1)) <= hi and set(point) == names
                and all(point[t.name] in values_of(t) for t in row.info.tunables)):
            us = entry.get("us", {})
            chosen, deflt = us.get(spell(point)), us.get(entry.get("default", ""))
            measured = (f": {chosen:.1f} µs against the default's {deflt:.1f} at {schema.params[0].name}="
                        f"{entry['extent']}") if chosen and deflt else ""
            return dict(point), f"tuned {spell(point)} (rad-tune{measured})"
    return default_point(row), f"{spell(default_point(row))} (default)"


def record(path: Path, row, schema, geometry: dict, extent: int, point: dict, timings: dict, default: dict) -> None:
    """Keep rad-tune's choice for this row, geometry and extent (replacing an earlier one)."""
    entries = dict(read(path))
    wanted = shape_key(schema, geometry)
    kept = [e for e in entries.get(key_of(row), [])
            if not (e.get("geometry") == wanted and e.get("extent") == extent)]
    kept.append({"geometry": wanted, "extent": extent, "point": point,
                 "us": {spell(p): round(t * 1e6, 2) for p, t in timings}, "default": spell(default)})
    entries[key_of(row)] = kept
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(entries, indent=1))
    temporary.replace(path)
