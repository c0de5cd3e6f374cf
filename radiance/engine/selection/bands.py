"""Row selection: per op, per band of its ranged extent, per domain. The first library in the
hierarchy with any matching row supplies the op; inside it, priority (highest first), then
declaration order. Reference rows serve only when the user accepts them."""

from dataclasses import dataclass, field

from radiance.abi import (
    RAD_C_EQ, RAD_DERIVED, RAD_DOMAIN_DEVICE, RAD_FACT_PREFIX, RAD_PROLE_CAPACITY, RAD_PROLE_SEQ_CHUNK,
    RadOpSchema,
)

from .constraints import band_starts, describe, holds, holds_for_band
from .tuning import default_point, spell, tuned_point
from radiance.engine.loading.records import Row

DOMAINS = {1: "host", RAD_DOMAIN_DEVICE: "device"}
REFERENCE_FLAG = "--debug-accept-reference-kernels"


class SelectionError(ValueError):
    """No row serves an op for a band: names the op, the band and, where it helps, the flag."""


@dataclass
class Band:
    lo: int
    hi: int
    row: Row
    geometry: dict  # the op's parameters, the band's upper bound and every derived value
    losers: list = field(default_factory=list)  # (row, why it did not win)
    instance: object = None
    tuned: str = ""  # the winner's tunables' point, and how it was chosen (tuning.py)


@dataclass
class Resolution:
    op: str
    domain: int
    ranged: str  # the schema's params[0]
    bands: list[Band]
    seq_chunk: str | None  # the parameter the scheduler cuts steps on
    capacity: list[str]
    gaps: list = field(default_factory=list)  # (lo, hi, losers) no row serves; only where gaps are allowed

    def find(self, extent: int) -> Band | None:
        for band in self.bands:
            if band.lo <= extent <= band.hi:
                return band
        return None

    def band_for(self, extent: int) -> Band:
        band = self.find(extent)
        if band is None:
            raise SelectionError(f"op '{self.op}': {self.ranged}={extent} is outside every resolved band")
        return band

    def instantiate(self) -> None:
        """init() once per (op, band, domain), at the band's upper bound."""
        for band in self.bands:
            if band.row.info.init is not None and band.instance is None:
                band.instance = band.row.info.init(dict(band.geometry))

    def release(self) -> None:
        for band in self.bands:
            if band.instance is not None and band.row.info.fini is not None:
                band.row.info.fini(band.instance)
            band.instance = None


def _refusal(row: Row, derived, geometry, facts, ranged, lo, hi) -> str | None:
    """The first constraint of `row` that does not hold for this band, or None."""
    for constraint in row.info.constraints:
        key = constraint.key
        if key in derived:
            continue  # supplied by the winner, not matched
        if key == ranged:
            if not holds_for_band(constraint, lo, hi):
                return f"{describe(constraint)} does not hold for {ranged} in [{lo}, {hi}]"
        elif key.startswith(RAD_FACT_PREFIX):
            if key not in facts:
                return f"{describe(constraint)}: {key} was not measured"
            if not holds(constraint, facts[key]):
                return f"{describe(constraint)} does not hold ({key} is {facts[key]})"
        elif key not in geometry:
            return f"{describe(constraint)}: the geometry omits {key}"
        elif not holds(constraint, geometry[key]):
            return f"{describe(constraint)} does not hold ({key} is {geometry[key]})"
    if row.info.tunables and row.info.tune_valid is not None:
        # the default point is what runs wherever nothing was tuned: it must be legal at the band
        point = default_point(row)
        if not row.info.tune_valid({**geometry, ranged: hi, **point}):
            return f"its tunables' default point {spell(point)} is not legal here (tune_valid)"
    return None


def row_refusal(row: Row, schema: RadOpSchema, geometry: dict, facts: dict) -> str | None:
    """Why `row` does not serve this one geometry (its ranged extent a single value), or None."""
    ranged = schema.params[0].name
    derived = {p.name for p in schema.params if p.req == RAD_DERIVED}
    value = int(geometry[ranged])
    return _refusal(row, derived, geometry, facts, ranged, value, value)


def _pick(rows, schema, geometry, facts, domain, lo, hi, accept_reference):
    ranged = schema.params[0].name
    derived = {p.name for p in schema.params if p.req == RAD_DERIVED}
    losers, matching, reference_match = [], [], None
    for row in rows:
        if row.info.domain != domain:
            continue
        why = _refusal(row, derived, geometry, facts, ranged, lo, hi)
        if why is None and row.reference and not accept_reference:
            reference_match = reference_match or row
            why = f"a reference row serves only with {REFERENCE_FLAG}"
        if why is None:
            matching.append(row)
        else:
            losers.append((row, why))
    if not matching:
        return None, losers, reference_match
    library = matching[0].plugin
    mine = [row for row in matching if row.plugin is library]
    winner = sorted(mine, key=lambda row: (-row.info.priority, row.index))[0]
    for row in matching:
        if row is winner:
            continue
        if row.plugin is not library:
            losers.append((row, f"hierarchy: {library.name} supplies this op"))
        elif row.info.priority < winner.info.priority:
            losers.append((row, f"priority {row.info.priority} < {winner.info.priority}"))
        else:
            losers.append((row, f"declared after {winner.name} at the same priority"))
    return winner, losers, None


def resolve(op: str, schema: RadOpSchema, rows: list[Row], geometry: dict, facts: dict, domain: int,
            max_extent: int, accept_reference: bool = False, allow_gaps: bool = False) -> Resolution:
    """Resolve an op over its ranged extent [1, max_extent]. `rows` in hierarchy order. With
    `allow_gaps` (a fused op, whose chain runs where no fused row serves) a band without a winner
    is kept as a gap instead of failing."""
    ranged = schema.params[0].name
    candidates = [row for row in rows if row.info.domain == domain]
    starts = sorted(band_starts([c for row in candidates for c in row.info.constraints], ranged, 1, max_extent))
    edges = starts + [max_extent + 1]
    bands: list[Band] = []
    gaps = []
    for lo, next_lo in zip(edges, edges[1:]):
        hi = next_lo - 1
        winner, losers, reference_match = _pick(candidates, schema, geometry, facts, domain, lo, hi, accept_reference)
        if winner is None and allow_gaps:
            gaps.append((lo, hi, losers))
            continue
        if winner is None:
            where = f"op '{op}' for {ranged} in [{lo}, {hi}] on the {DOMAINS[domain]} domain"
            refused = [f"{row.plugin.name}:{row.name}: {why}" for row, why in losers if not row.reference][:3]
            why_not = f" ({'; '.join(refused)})" if refused else ""
            if reference_match is not None:
                raise SelectionError(f"{where}: only the reference row {reference_match.plugin.name}:"
                                     f"{reference_match.name} matches; serving from it needs {REFERENCE_FLAG}"
                                     f"{why_not}")
            raise SelectionError(f"no library serves {where}{why_not}")
        resolved = {**geometry, ranged: hi}
        resolved.update({c.key: (c.sval if c.sval is not None else c.ival)
                         for c in winner.info.constraints
                         if c.op == RAD_C_EQ and any(p.name == c.key and p.req == RAD_DERIVED for p in schema.params)})
        point, tuned = tuned_point(winner, schema, resolved, lo, hi)
        resolved.update(point)  # the tuned point reaches the row as ordinary parameters
        previous = bands[-1] if bands else None
        if previous and previous.hi == lo - 1 and previous.row is winner and {**previous.geometry, ranged: hi} == resolved:
            previous.hi, previous.geometry = hi, resolved
            continue
        bands.append(Band(lo, hi, winner, resolved, losers, tuned=tuned))
    roles = {p.role: p.name for p in schema.params}
    return Resolution(op, domain, ranged, bands, roles.get(RAD_PROLE_SEQ_CHUNK),
                      [p.name for p in schema.params if p.role == RAD_PROLE_CAPACITY], gaps)


def describe_resolution(resolution: Resolution) -> list[str]:
    """What --debug-selection prints: each band's winner, and why every other candidate lost."""
    lines = []
    for band in resolution.bands:
        lines.append(f"{resolution.op} {resolution.ranged}=[{band.lo}, {band.hi}] {DOMAINS[resolution.domain]}: "
                     f"{band.row.plugin.name}:{band.row.name}" + (f", {band.tuned}" if band.tuned else ""))
        lines += [f"    {row.plugin.name}:{row.name} lost: {why}" for row, why in band.losers]
    return lines
