"""A rank's graph resolved: every node to a row per band (resolved once per distinct (op, geometry),
so the thirty identical q projections of a model share one resolution and one init), then the
fusions on top of that.

A fusion (fusion.py) serves a value of its extent only where its fused row has a band for it and
its own library won every link of the chain there: between libraries the hierarchy is absolute, so
a later library's fused row never displaces an earlier library's plain rows. Elsewhere the chain
runs as declared. Where fusions overlap, the longest that serves is taken, first in graph order.
What a step launches is worked out per (tokens, seqs) by `launches`; the executors keep it."""

import hashlib
from dataclasses import dataclass

from radiance.abi import RAD_EXTENT_SEQS, RAD_EXTENT_TOKENS, RadOpSchema

from .fusion import Candidate, find_candidates
from radiance.engine.loading.registry import Registry
from .bands import Band, Resolution, SelectionError, describe_resolution, resolve
from .shard import RankNode
from .step_limits import CAPACITY_EXTENTS, EXTENT_NAMES, StepLimits, capacity_params, lower_bounds, seq_chunk_param


@dataclass
class ResolvedNode:
    node: RankNode
    schema: RadOpSchema
    resolution: Resolution


@dataclass
class Fusion:
    candidate: Candidate
    resolution: Resolution  # the fused op over its library's rows that replace this chain; gaps allowed

    @property
    def node(self) -> RankNode:
        return self.candidate.node

    @property
    def start(self) -> int:
        return self.candidate.start

    @property
    def length(self) -> int:
        return len(self.candidate.links)


@dataclass(frozen=True)
class Launch:
    """One row launch of a step: a node (a fused one, or a plain one) and the band it runs in."""
    position: int  # where the node, or its chain's first link, stands in the rank's graph
    node: RankNode
    schema: RadOpSchema
    band: Band


class ResolvedGraph:
    def __init__(self, items: list[ResolvedNode], fusions: list[Fusion], notes: list[str], max_tokens: int,
                 max_seqs: int):
        self.items, self.fusions, self.notes = items, fusions, notes
        # the largest step the rows serve (step_limits.py): the scheduler plans none larger
        self.max_extent = {RAD_EXTENT_TOKENS: max_tokens, RAD_EXTENT_SEQS: max_seqs}
        order = {id(library): i for i, library in enumerate(dict.fromkeys(f.candidate.library for f in fusions))}
        self._starting: dict = {}
        for fusion in sorted(fusions, key=lambda f: (-f.length, order[id(f.candidate.library)])):
            self._starting.setdefault(fusion.start, []).append(fusion)

    # ---- what a step launches ---------------------------------------------------------------------
    def refusal(self, fusion: Fusion, extent: int) -> str | None:
        """Why `fusion` does not serve this extent on its own (None: it does)."""
        if fusion.resolution.find(extent) is None:
            for lo, hi, losers in fusion.resolution.gaps:
                if lo <= extent <= hi:
                    lost = "; ".join(f"{row.plugin.name}:{row.name}: {why}" for row, why in losers[:2])
                    return f"no fused row serves it ({lost})" if lost else "no fused row serves it"
            return "no fused row serves it"
        library = fusion.candidate.library
        for item in self.items[fusion.start:fusion.start + fusion.length]:
            winner = item.resolution.band_for(extent).row
            if winner.plugin is not library:
                return f"hierarchy: {winner.plugin.name} serves {item.node.op} at {item.node.name}"
        return None

    def _walk(self, extents: dict) -> list[Launch]:
        launches, position = [], 0
        while position < len(self.items):
            item = self.items[position]
            extent = extents[item.node.extent]
            fusion = next((f for f in self._starting.get(position, ()) if self.refusal(f, extent) is None), None)
            if fusion is not None:
                launches.append(Launch(position, fusion.node, fusion.candidate.schema, fusion.resolution.find(extent)))
                position += fusion.length
            else:
                launches.append(Launch(position, item.node, item.schema, item.resolution.band_for(extent)))
                position += 1
        return launches

    def launches(self, tokens: int, seqs: int) -> list[Launch]:
        """The launches of one step over `tokens` tokens of `seqs` sequences, in order."""
        return self._walk({RAD_EXTENT_TOKENS: tokens, RAD_EXTENT_SEQS: seqs})

    # ---- the whole range at once ------------------------------------------------------------------
    def _segments(self, kind: int) -> list[tuple[int, int]]:
        """[lo, hi] pieces of an extent kind over which every node's and fusion's choice is constant."""
        resolutions = [item.resolution for item in self.items if item.node.extent == kind]
        resolutions += [fusion.resolution for fusion in self.fusions if fusion.node.extent == kind]
        top = self.max_extent[kind]
        starts = {1} | {band.lo for r in resolutions for band in r.bands} | {lo for r in resolutions for lo, _, _ in r.gaps}
        starts |= {band.hi + 1 for r in resolutions for band in r.bands}
        edges = sorted(start for start in starts if 1 <= start <= top) + [top + 1]
        return [(lo, next_lo - 1) for lo, next_lo in zip(edges, edges[1:])]

    def issued(self) -> list[tuple[Launch, int, int]]:
        """Every launch some step can issue with the [lo, hi] of its extent it is issued over, in
        graph order: adjacent pieces with the same launch merged."""
        pieces = []
        for kind in (RAD_EXTENT_TOKENS, RAD_EXTENT_SEQS):
            for lo, hi in self._segments(kind):
                extents = {RAD_EXTENT_TOKENS: 1, RAD_EXTENT_SEQS: 1, kind: lo}
                pieces += [(launch, lo, hi) for launch in self._walk(extents) if launch.node.extent == kind]
        pieces.sort(key=lambda entry: (entry[0].position, entry[1]))
        merged = []
        for launch, lo, hi in pieces:
            last = merged[-1] if merged else None
            if last and last[0].node is launch.node and last[0].band is launch.band and last[2] == lo - 1:
                merged[-1] = (last[0], last[1], hi)
            else:
                merged.append((launch, lo, hi))
        return merged

    def resolutions(self) -> list[Resolution]:
        """Each distinct resolution once: the nodes' and the fusions'."""
        every = [item.resolution for item in self.items] + [fusion.resolution for fusion in self.fusions]
        return list({id(r): r for r in every}.values())

    def lines(self) -> list[str]:
        """What every rank must agree on before a step runs: what each extent issues, and which row."""
        return [f"{launch.node.name}|{launch.node.op}|[{lo}, {hi}]|{launch.band.row.plugin.name}:{launch.band.row.name}"
                for launch, lo, hi in self.issued()]

    def digest(self) -> str:
        return hashlib.sha256("\n".join(self.lines()).encode()).hexdigest()

    def report(self) -> list[str]:
        """--debug-selection: each distinct resolution once with the nodes it serves, then each
        fusion with where it runs and, where it does not, why."""
        lines = []
        for resolution in {id(item.resolution): item.resolution for item in self.items}.values():
            users = [item.node.name for item in self.items if item.resolution is resolution]
            lines.append(f"[{_shown(users)}]")
            lines += ["  " + line for line in describe_resolution(resolution)]
        issued = {}
        for launch, lo, hi in self.issued():
            issued.setdefault(id(launch.node), []).append((lo, hi))
        for resolution in {id(f.resolution): f.resolution for f in self.fusions}.values():
            members = [f for f in self.fusions if f.resolution is resolution]
            lines.append(f"[{_shown([f.node.name for f in members])}] fused by {members[0].candidate.library.name}, "
                         f"replaces {members[0].candidate.rows[0].info.replaces}")
            lines += ["  " + line for line in describe_resolution(resolution)]
            lines += ["  " + line for line in self._not_taken(members[0], issued.get(id(members[0].node), []))]
        return lines + self.notes

    def _not_taken(self, fusion: Fusion, taken: list) -> list[str]:
        """Where the chain runs instead of the fused row, and why: pieces with one reason merged."""
        pieces = []  # [lo, hi, why]
        for lo, hi in self._segments(fusion.node.extent):
            if any(a <= lo and hi <= b for a, b in taken):
                continue
            why = self.refusal(fusion, lo) or "an overlapping fusion is taken instead"
            if pieces and pieces[-1][2] == why and pieces[-1][1] == lo - 1:
                pieces[-1][1] = hi
            else:
                pieces.append([lo, hi, why])
        return [f"{fusion.resolution.ranged}=[{lo}, {hi}]: the chain runs: {why}" for lo, hi, why in pieces]


def _shown(names: list[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def resolve_graph(nodes: list[RankNode], registry: Registry, facts: dict, domain: int, max_tokens: int,
                  max_seqs: int, accept_reference: bool = False, fusion: bool = True) -> ResolvedGraph:
    """Every node resolved over [1, the step's largest extent of its kind]; that largest extent is
    lowered where the rows serve less and the parameter roles allow a cut (step_limits.py)."""
    resolutions: dict = {}  # (op, extent, geometry, top[, fused rows]) -> Resolution, shared by every node alike
    limits = StepLimits({RAD_EXTENT_TOKENS: max_tokens, RAD_EXTENT_SEQS: max_seqs})

    def attempt(op, extent, params, rows, schema, gaps, key_extra, top):
        key = (op, extent, tuple(sorted(params.items())), top, *key_extra)
        if key not in resolutions:
            resolutions[key] = resolve(op, schema, rows, params, facts, domain, top, accept_reference,
                                       allow_gaps=gaps)
        return resolutions[key]

    def resolved(op, name, extent, params, rows, schema, gaps=False, key_extra=()):
        top = limits.extents[extent]
        capacities = [p for p in capacity_params(schema) if p not in params]
        bounds = {p: limits.extents[CAPACITY_EXTENTS[p]] for p in capacities}
        params = {**params, **bounds}  # a capacity is handed the step's bound on its count
        try:
            return attempt(op, extent, params, rows, schema, gaps, key_extra, top)
        except SelectionError as error:
            if gaps:
                raise
            first = SelectionError(f"node '{name}': {error}")
        chunk = seq_chunk_param(schema)
        tops = [top] + (lower_bounds(rows, chunk, top) if chunk else [])
        # a lower capacity only where the step's cannot be served at any cut
        for capacity, bound in [(None, None)] + [(p, b) for p in capacities for b in lower_bounds(rows, p, bounds[p])]:
            trial = params if capacity is None else {**params, capacity: bound}
            for cut in tops[1:] if capacity is None else tops:
                try:
                    resolution = attempt(op, extent, trial, rows, schema, gaps, key_extra, cut)
                except SelectionError:
                    continue
                if capacity is not None:
                    kind = CAPACITY_EXTENTS[capacity]
                    limits.lower(kind, bound, f"steps hold at most {bound} {EXTENT_NAMES[kind]}: node '{name}' "
                                              f"({op}) has no row for {capacity}={bounds[capacity]} (capacity)")
                if cut < top:
                    limits.lower(extent, cut, f"steps are cut at {cut} {EXTENT_NAMES[extent]}: node '{name}' "
                                              f"({op}) has no row for {chunk} in [{cut + 1}, {top}] (seq_chunk)")
                return resolution
        raise first from None

    items = []
    for node in nodes:
        entry = registry.ops.get(node.op)
        if entry is None:
            raise SelectionError(f"node '{node.name}': no loaded library declares op '{node.op}'")
        items.append(ResolvedNode(node, entry.schema, resolved(node.op, node.name, node.extent, node.params,
                                                               registry.rows_for(node.op), entry.schema)))
    fusions, notes = [], []
    if fusion:
        candidates, notes = find_candidates(nodes, registry, domain)
        for candidate in candidates:
            node = candidate.node
            resolution = resolved(node.op, node.name, node.extent, node.params, candidate.rows, candidate.schema,
                                  gaps=True, key_extra=(id(candidate.library), candidate.rows[0].info.replaces))
            fusions.append(Fusion(candidate, resolution))
    return ResolvedGraph(items, fusions, limits.notes + notes, limits.tokens, limits.seqs)
