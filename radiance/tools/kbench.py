"""rad-kbench --kernels A,B,... [--report R.md] [--bench] [--strict]: every library named checked
against libref's recorded answers over the in-tree models' geometries (kernel_cases.py), op by op.

Per case, each named library's row for it (the one selection would take: its constraints hold at
the case's geometry, then priority, then declaration order) is called cold (kernel_runner.py) and
its outputs measured against the fixture (kernel_fixture.py): sampled values, the full-tensor norm,
seeded projections, with the op's tolerance. A row with `replaces` is also run against its chain
out of the same library and every operand compared byte for byte. A row that cannot be called cold
(no `opd_shape`) is skipped with the reason; a stale fixture case is recorded again from libref,
or with --strict fails. The report: the op-by-library completeness matrix, every failure and skip
named, the fusion checks and, with --bench, the time of each launch on the same bytes."""

import datetime
import sys
from dataclasses import dataclass, field
from pathlib import Path

import click
import numpy as np

from radiance.abi.shapes import SHAPES
from radiance.abi import (
    RAD_DOMAIN_DEVICE, RAD_DOMAIN_HOST, RAD_PLUGIN_KERNEL, RAD_PLUGIN_QUANT, RadWeightPlanes, operand_shapes, rad_tensor,
)
from radiance.engine.loading.hierarchy import entry_matches, parse_kernels
from radiance.engine.loading.homes import HomeError, search_path
from radiance.engine.loading.registry import KernelsError, Registry
from radiance.engine.loading.replaces import parse_chain
from radiance.engine.selection.bands import row_refusal
from radiance.log import get_logger
from radiance.weights.planes import stored

from . import options
from .kernel_cases import READ_ROLES, default_cases, digest, fill
from .kernel_fixture import TOLERANCE, Fixture, FixtureError, compare, output_seed, row_tolerance, source_hash
from .kernel_runner import Card, DeviceCall, Failure, HostCall, Skip, check_opd_shape, row_geometry, time_launches


QUANTIZERS = {"q4_1": ("q4_1", {"group": 32}), "q8_0": ("q8_0", {"group": 32})}
REFERENCE = "libref"
log = get_logger("radiance.kbench")


@dataclass
class Outcome:
    case: str
    op: str
    library: str
    row: str
    failures: list = field(default_factory=list)  # (measure, what)
    skip: str | None = None
    notes: list = field(default_factory=list)
    seconds: float | None = None

    @property
    def passed(self) -> bool:
        return self.skip is None and not self.failures


@dataclass
class Fusion:
    case: str
    library: str
    row: str
    chain: str
    difference: str | None  # None: every operand the same bytes
    skip: str | None = None


@dataclass
class Results:
    libraries: list
    outcomes: list = field(default_factory=list)
    fusions: list = field(default_factory=list)
    stale: list = field(default_factory=list)  # (case, why)
    recorded: int = 0
    unrecorded: list = field(default_factory=list)  # (case, why no answer could be had)
    cases: int = 0

    @property
    def failed(self) -> bool:
        return (any(o.failures for o in self.outcomes) or any(f.difference for f in self.fusions))


def quantizer(registry):
    """`quantize(wdtype, f32 [rows, cols]) -> RadWeightPlanes` through the registry's quantisers."""
    def quantize(wdtype, values):
        name, given = QUANTIZERS.get(wdtype, ("plain", {"dtype": wdtype}))
        info = registry.quantizers[name][0]
        encoding = info.encoding("kbench", values.shape, given)
        planes = info.quantize(encoding, np.ascontiguousarray(values, np.float32), 0, given)
        tensors = [rad_tensor(stored(plane, planes[plane.name], values.shape)) for plane in encoding.planes]
        return RadWeightPlanes(encoding=encoding, rows=values.shape[0], cols=values.shape[1], planes=tensors)
    return quantize


def serving_row(library, schema, geometry: dict, domain: int, facts: dict):
    """The row of `library` selection would take for this geometry, or None."""
    matching = [row for row in library.rows if row.op == schema.op and row.info.domain == domain
                and row_refusal(row, schema, geometry, facts) is None]
    return sorted(matching, key=lambda row: (-row.info.priority, row.index))[0] if matching else None


class KernelBench:
    def __init__(self, registry: Registry, libraries: list, fixture: Fixture, *, strict=False, bench=False,
                 card=None, facts=None, reference=None):
        self.registry, self.libraries, self.fixture = registry, libraries, fixture
        self.strict, self.bench, self.card, self.facts = strict, bench, card, facts or {}
        self.domain = RAD_DOMAIN_DEVICE if card is not None else RAD_DOMAIN_HOST
        self.reference = reference or next((lib for lib in registry.hierarchy if lib.name == REFERENCE), None)
        self.libref_hash = source_hash(self.reference.path) if self.reference else ""
        self.quantize = quantizer(registry)

    def run(self, cases) -> Results:
        results = Results([lib.name for lib in self.libraries], cases=len(cases))
        for case in cases:
            entry = self.registry.ops.get(case.op)
            if entry is None:
                results.unrecorded.append((case.name, f"op '{case.op}' is declared by no loaded library"))
                continue
            schema = entry.schema
            operands = fill(case, schema, self.quantize)
            inputs = digest(operands)
            why = self.fixture.staleness(case, inputs, self.libref_hash)
            if why is not None:
                results.stale.append((case.name, why))
                if self.strict:
                    continue
                problem = self._record(case, schema, operands, inputs)
                if problem:
                    results.unrecorded.append((case.name, problem))
                    continue
                results.recorded += 1
            for library in self.libraries:
                outcome = self._check(case, schema, library, operands)
                if outcome is not None:
                    results.outcomes.append(outcome)
                    fusion = self._fusion(case, schema, library, outcome, operands)
                    if fusion is not None:
                        results.fusions.append(fusion)
        return results

    # -- libref's answer -------------------------------------------------------------------------

    def _record(self, case, schema, operands, inputs) -> str | None:
        if self.reference is None:
            return f"no fixture answer and no {REFERENCE} on the search path to record one"
        row = serving_row(self.reference, schema, case.params, RAD_DOMAIN_HOST, {})
        if row is None:
            return f"{REFERENCE} has no row for it"
        geometry = {**row_geometry(row, schema, case.params), **case.cold}
        call = HostCall(row, schema, geometry, operands)
        try:
            call.build()
            call.launch()
        except (Failure, Skip) as error:
            return f"{REFERENCE}:{row.name}: {error}"
        finally:
            call.close()
        outputs = {i: (spec.name, call.result(i)) for i, spec in enumerate(schema.operands) if spec.role in READ_ROLES}
        self.fixture.record(case, inputs, self.libref_hash, row.name, outputs)
        return None

    # -- one library's row -----------------------------------------------------------------------

    def _call(self, row, schema, geometry, operands):
        if self.domain == RAD_DOMAIN_DEVICE:
            return DeviceCall(row, schema, geometry, operands, self.card)
        return HostCall(row, schema, geometry, operands)

    def _check(self, case, schema, library, operands) -> Outcome | None:
        row = serving_row(library, schema, case.params, self.domain, self.facts)
        if row is None:
            return None
        outcome = Outcome(case.name, case.op, library.name, row.name)
        geometry = {**row_geometry(row, schema, case.params), **case.cold}
        call = None
        try:
            check_opd_shape(row, schema, geometry, operand_shapes(case.op, case.geometry))
            call = self._call(row, schema, geometry, operands)
            call.build()
            call.launch()
            recorded = self.fixture.cases[case.name]["outputs"]
            tolerance = row_tolerance(row, case.op)
            if row.tolerance is not None:
                outcome.notes.append(f"held to its own tolerance {tolerance:g} (rad_kernel_tolerance), "
                                     f"{case.op}'s being {TOLERANCE.get(case.op, 0.0):g}")
            for i, spec in enumerate(schema.operands):
                if spec.role not in READ_ROLES:
                    continue
                for measure, what in compare(recorded[str(i)], call.result(i), output_seed(case.seed, i), tolerance):
                    outcome.failures.append((measure, f"'{spec.name}' {what}"))
            if self.bench:
                outcome.seconds = time_launches(call, sync=self.card.sync if self.card is not None else None)
        except Skip as skip:
            outcome.skip = str(skip)
        except Failure as failure:
            outcome.failures.append((failure.measure, failure.what))
        except Exception as error:  # a plugin's hook or launch may raise anything: one line for it
            outcome.failures.append(("raised", f"{type(error).__name__}: {error}"))
        finally:
            if call is not None:
                outcome.notes += call.notes
                call.close()
        return outcome

    # -- replaces: the fused row against its chain, bytewise --------------------------------------

    def _fusion(self, case, schema, library, outcome, operands) -> Fusion | None:
        row = next((r for r in library.rows if r.name == outcome.row), None)
        if row is None or not row.info.replaces or outcome.skip or outcome.failures:
            return None
        chain = parse_chain(row.info.replaces)
        fusion = Fusion(case.name, library.name, row.name, row.info.replaces, None)
        geometry = {**row_geometry(row, schema, case.params), **case.cold}
        fused = self._call(row, schema, geometry, operands)
        links = []
        try:
            fused.build()
            fused.launch()
            by_name = dict(zip((spec.name for spec in schema.operands), operands))
            for i, (op, slots) in enumerate(zip(chain.ops, chain.slots)):
                link_schema = self.registry.ops[op].schema
                params = link_params(case.params, case.op, op, slots, link_schema, i)
                link_row = serving_row(library, link_schema, params, self.domain, self.facts)
                if link_row is None:
                    fusion.skip = f"{library.name} has no row for link {i} ({op})"
                    return fusion
                link_geometry = {**row_geometry(link_row, link_schema, params), **case.cold}
                links.append(self._call(link_row, link_schema, link_geometry, [by_name[name] for name in slots]))
            latest = self._run_chain(links, chain)
            for i, spec in enumerate(schema.operands):
                if not isinstance(operands[i], np.ndarray):
                    continue
                want = np.asarray(latest.get(spec.name, operands[i]))
                got = fused.result(i)
                if got.tobytes() != want.tobytes():
                    bad = np.flatnonzero(got.reshape(-1).view(np.uint8) != want.reshape(-1).view(np.uint8))
                    fusion.difference = (f"operand '{spec.name}' differs in {bad.size} byte(s), the first at byte "
                                         f"{int(bad[0])}")
                    break
        except (Failure, Skip) as error:
            fusion.difference = f"{error}"
        finally:
            fused.close()
            for link in links:
                link.close()
        return fusion

    @staticmethod
    def _run_chain(links, chain) -> dict:
        """Each link on the previous links' results; returns {operand: its value after the chain} of
        every operand a link wrote."""
        latest = {}
        for link, slots in zip(links, chain.slots):
            link.operands = [latest.get(name, operand) for name, operand in zip(slots, link.operands)]
            link.build()
            link.launch()
            for j, name in enumerate(slots):
                if link.schema.operands[j].role in READ_ROLES:
                    latest[name] = link.result(j)
        return latest


def link_params(fused_params: dict, fused_op: str, op: str, slots, link_schema, index: int) -> dict:
    """Link `index` (op) of a fused case's chain: each parameter as `name.index`, else `name`, else read
    off the extents the link's operands share with the fused op's (abi/shapes.py): silu_mul's n is
    the fused rmsnorm_gemm2_silu_mul's N.1, the extent of the `gate` both name."""
    params = {p.name: fused_params.get(f"{p.name}.{index}", fused_params.get(p.name)) for p in link_schema.params}
    params = {k: v for k, v in params.items() if v is not None}
    mine, theirs = SHAPES.get(op, {}), SHAPES.get(fused_op, {})
    for spec, slot in zip(link_schema.operands, slots):
        if spec.name in mine and slot in theirs:
            for extent, fused_extent in zip(mine[spec.name][1:], theirs[slot][1:]):
                if isinstance(extent, str) and extent not in params and fused_extent in fused_params:
                    params[extent] = fused_params[fused_extent]
    return params


# ------------------------------------------------------------------------------------------------
# the report

def _cell(outcomes) -> str:
    if not outcomes:
        return "—"
    passed = sum(o.passed for o in outcomes)
    skipped = sum(o.skip is not None for o in outcomes)
    text = f"{passed}/{len(outcomes)}"
    return text + (f" ({skipped} skipped)" if skipped else "")


def report(results: Results, fixture: Fixture, cases, when: str, command: str, strict: bool = False) -> str:
    lines = [f"# rad-kbench: {', '.join(results.libraries)}", "", f"`{command}` ({when})", "",
             f"Fixture `{fixture.path}`: {results.cases} cases; "
             f"{results.recorded} recorded in this run, {len(results.stale)} stale.", ""]
    ops = list(dict.fromkeys(case.op for case in cases))
    lines += ["## Completeness: cases passed / cases with a row, per op and library", "",
              "| op | cases | " + " | ".join(results.libraries) + " |",
              "|---|---|" + "---|" * len(results.libraries)]
    for op in ops:
        count = sum(case.op == op for case in cases)
        cells = [_cell([o for o in results.outcomes if o.op == op and o.library == lib]) for lib in results.libraries]
        lines.append(f"| {op} | {count} | " + " | ".join(cells) + " |")
    failures = [o for o in results.outcomes if o.failures]
    lines += ["", f"## Failures ({len(failures)})", ""]
    lines += [f"- `{o.case}` {o.library}:{o.row}: " + "; ".join(f"**{m}** {w}" for m, w in o.failures)
              for o in failures] or ["none"]
    skips = [o for o in results.outcomes if o.skip]
    lines += ["", f"## Skips ({len(skips)})", ""]
    lines += [f"- `{o.case}` {o.library}:{o.row}: {o.skip}" for o in skips] or ["none"]
    lines += [f"- `{name}`: {why}" for name, why in results.unrecorded]
    notes = sorted({f"{o.library}:{o.row}: {note}" for o in results.outcomes for note in o.notes})
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    lines += ["", "## Fusion: each `replaces` row against its chain out of the same library (memcmp)", ""]
    lines += [f"- `{f.case}` {f.library}:{f.row} vs `{f.chain}`: "
              + (f"skipped: {f.skip}" if f.skip else f"**differs**: {f.difference}" if f.difference else "same bytes")
              for f in results.fusions] or ["no fused row served a case"]
    if results.stale:
        lines += ["", "## Stale fixture cases (" + ("failed: --strict" if strict else "recorded again from libref") + ")", ""] + [f"- `{name}`: {why}" for name, why in results.stale]
    timed = [o for o in results.outcomes if o.seconds is not None]
    if timed:
        lines += ["", "## Speed: µs per launch on the same bytes (median), and libref's time over each", "",
                  "| case | " + " | ".join(results.libraries) + " |", "|---|" + "---|" * len(results.libraries)]
        for case in cases:
            here = {o.library: o for o in timed if o.case == case.name}
            if not here:
                continue
            peer = here.get(REFERENCE)
            cells = []
            for lib in results.libraries:
                o = here.get(lib)
                if o is None:
                    cells.append("—")
                    continue
                ratio = f" ({peer.seconds / o.seconds:.1f}x)" if peer and lib != REFERENCE and o.seconds else ""
                cells.append(f"{o.seconds * 1e6:.1f}{ratio}")
            lines.append(f"| `{case.name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def fixture_path(radiance_home: str | None) -> Path:
    """$RADIANCE_HOME's first home (or --radiance-home's)/kernels.rkb; else the radiance cache."""
    homes = [home for home in search_path(radiance_home)[:-1]]
    if homes:
        return homes[0] / "kernels.rkb"
    from radiance.convert.cache import cache_dir
    return cache_dir().parent / "kernels.rkb"


def open_card(registry: Registry) -> Card:
    """The card this process sees, as `radiance` finds it; the device rows of a library whose
    build_target it does not run left out (the log says so)."""
    import os
    from radiance.device.selection import backend_name, open_device
    from radiance.engine.running.device_stream import EngineStream
    from radiance.engine.selection.device_targets import leave_out_foreign_device_code
    from radiance.launch.devices import pin_this_process
    environ = dict(os.environ)
    pin_this_process(environ)
    if backend_name(environ) is None:
        raise click.ClickException("--device card: no card on this machine (none visible to this process)")
    device = open_device(environ)
    leave_out_foreign_device_code(registry, device.vendor, device.target, log=log)
    return Card(device, EngineStream(device))


def select_libraries(registry: Registry, entries: list[str], option: str = "--kernels") -> list:
    libraries = []
    for entry in entries:
        found = [lib for lib in registry.hierarchy if entry_matches(entry, lib.path, lib.name)]
        if not found:
            raise click.ClickException(f"{option}: '{entry}' matches no kernel library on the search path")
        libraries += [lib for lib in found if lib not in libraries]
    return libraries


@click.command()
@click.option("--kernels", required=True, metavar="LIBS", help="The kernel libraries to check, e.g. 'mylib,libr4d,libref'.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), default=None,
              help="Write the report (markdown) here as well as printing its summary.")
@click.option("--bench", is_flag=True, help="Also time every launch on the same bytes.")
@click.option("--strict", is_flag=True, help="Fail on a stale or missing fixture case instead of recording it again.")
@click.option("--fixture", "fixture_file", type=click.Path(dir_okay=False), default=None,
              help="The fixture file (default: $RADIANCE_HOME/kernels.rkb, else ~/.cache/radiance/kernels.rkb).")
@click.option("--cases", "only", default=None, metavar="TEXT", help="Only the cases whose name contains TEXT.")
@click.option("--device", type=click.Choice(["host", "card"]), default="host", show_default=True,
              help="host: the host rows; card: the device rows, on the card this process sees.")
@options.radiance_home
def main(kernels, report_path, bench, strict, fixture_file, only, device, radiance_home):
    """Check kernel libraries against libref's recorded answers; exit 1 on any failure."""
    try:
        path = Path(fixture_file) if fixture_file else fixture_path(radiance_home)
        fixture = Fixture.read(path)
        registry = Registry(radiance_home=radiance_home, kernels=kernels, kinds=(RAD_PLUGIN_KERNEL, RAD_PLUGIN_QUANT))
    except (HomeError, KernelsError, FixtureError) as error:
        raise click.ClickException(str(error)) from None
    try:
        libraries = select_libraries(registry, parse_kernels(kernels))
        cases = [case for case in default_cases() if not only or only in case.name]
        if not cases:
            raise click.ClickException(f"--cases: no case name contains {only!r}")
        card = open_card(registry) if device == "card" else None
        try:
            results = KernelBench(registry, libraries, fixture, strict=strict, bench=bench, card=card).run(cases)
        finally:
            if card is not None:
                card.close()
    finally:
        registry.close()
    if results.recorded:
        fixture.write()
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = report(results, fixture, cases, when, "rad-kbench " + " ".join(sys.argv[1:]), strict)
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(text)
    failed = [o for o in results.outcomes if o.failures]
    for o in failed:
        click.echo(f"FAIL {o.case} {o.library}:{o.row}: " + "; ".join(f"{m}: {w}" for m, w in o.failures))
    for f in results.fusions:
        if f.difference:
            click.echo(f"FAIL fusion {f.case} {f.library}:{f.row}: {f.difference}")
    if strict and results.stale:
        for name, why in results.stale:
            click.echo(f"STALE {name}: {why}")
    skipped = sum(o.skip is not None for o in results.outcomes)
    click.echo(f"{len(cases)} cases, {len(results.outcomes)} row runs: {len(failed)} failed, {skipped} skipped, "
               f"{len(results.fusions)} fusion checks, {results.recorded} recorded into {fixture.path}"
               + (f"; report {report_path}" if report_path else ""))
    sys.exit(1 if results.failed or (strict and results.stale) else 0)


if __name__ == "__main__":
    main()
