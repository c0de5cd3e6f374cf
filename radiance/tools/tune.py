"""rad-tune --kernels A,B,...: for every row of the libraries named that declares tunables and serves
one of rad-kbench's cases, the cross product of its tunables filtered by its `tune_valid`, each
survivor called cold on the case's bytes, checked against libref's recorded answer (a point outside
the op's tolerance is no survivor) and timed; the fastest point is written to the cache selection
reads (engine/selection/tuning.py), per row, geometry and band (the case's extent lies in it).

The default point must be legal and launch and agree with libref: a row whose default does not is
an error naming it (exit 1), since the engine launches it wherever nothing was tuned."""

import sys
from pathlib import Path

import click

from radiance.abi import RAD_DOMAIN_HOST, RAD_PLUGIN_KERNEL, RAD_PLUGIN_QUANT, operand_shapes
from radiance.engine.loading.hierarchy import parse_kernels
from radiance.engine.loading.homes import HomeError
from radiance.engine.loading.registry import KernelsError, Registry
from radiance.engine.selection import tuning

from . import options
from .kbench import KernelBench, fixture_path, select_libraries, serving_row
from .kernel_cases import READ_ROLES, default_cases, digest, fill
from .kernel_fixture import Fixture, FixtureError, compare, output_seed, row_tolerance
from .kernel_runner import Failure, HostCall, Skip, check_opd_shape, row_geometry, time_launches


class TuneError(click.ClickException):
    pass


def legal(row, geometry: dict, point: dict) -> bool:
    return row.info.tune_valid is None or bool(row.info.tune_valid({**geometry, **point}))


def measure(bench: KernelBench, case, schema, row, operands, geometry: dict, point: dict) -> tuple[float | None, str]:
    """(seconds per launch, "") for a point that launches and agrees with libref, else (None, why)."""
    call = HostCall(row, schema, {**geometry, **point}, operands)
    try:
        check_opd_shape(row, schema, call.geometry, operand_shapes(case.op, case.geometry))
        call.build()
        call.launch()
        recorded = bench.fixture.cases[case.name]["outputs"]
        for i, spec in enumerate(schema.operands):
            if spec.role in READ_ROLES:
                failed = compare(recorded[str(i)], call.result(i), output_seed(case.seed, i),
                                 row_tolerance(row, case.op))
                if failed:
                    return None, f"'{spec.name}' fails {failed[0][0]}: {failed[0][1]}"
        return time_launches(call, budget_s=0.3, least=5), ""
    except (Failure, Skip) as error:
        return None, str(error)
    finally:
        call.close()


def tune(registry, libraries, fixture, cases, cache: Path, echo=click.echo) -> list[str]:
    """Tune every row with tunables that serves a case; returns the problems (default points)."""
    bench = KernelBench(registry, libraries, fixture)
    problems, recorded = [], 0
    for case in cases:
        entry = registry.ops.get(case.op)
        if entry is None:
            continue
        schema = entry.schema
        rows = [(lib, serving_row(lib, schema, case.params, RAD_DOMAIN_HOST, {})) for lib in libraries]
        rows = [(lib, row) for lib, row in rows if row is not None and row.info.tunables]
        if not rows:
            continue
        operands = fill(case, schema, bench.quantize)
        if fixture.staleness(case, digest(operands), bench.libref_hash):
            problem = bench._record(case, schema, operands, digest(operands))
            if problem:
                problems.append(f"{case.name}: {problem}")
                continue
            recorded += 1
        for library, row in rows:
            geometry = {**row_geometry(row, schema, case.params), **case.cold}
            default = tuning.default_point(row)
            if not legal(row, geometry, default):
                problems.append(f"{library.name}:{row.name}: its default point {tuning.spell(default)} is not "
                                f"legal at {case.name} (tune_valid)")
                continue
            timings, refused = [], []
            for point in tuning.points(row):
                if not legal(row, geometry, point):
                    refused.append(f"{tuning.spell(point)}: tune_valid")
                    continue
                seconds, why = measure(bench, case, schema, row, operands, geometry, point)
                if seconds is None:
                    if point == default:
                        problems.append(f"{library.name}:{row.name}: its default point {tuning.spell(point)} "
                                        f"does not pass at {case.name}: {why}")
                        break
                    refused.append(f"{tuning.spell(point)}: {why}")
                    continue
                timings.append((point, seconds))
            else:
                best, seconds = min(timings, key=lambda pair: pair[1])
                base = next(t for p, t in timings if p == default)
                tuning.record(cache, row, schema, case.params, int(case.params[schema.params[0].name]), best,
                              timings, default)
                measured = ", ".join(f"{tuning.spell(p)} {t * 1e6:.1f} µs" for p, t in timings)
                echo(f"{case.name} {library.name}:{row.name}: {tuning.spell(best)} ({base / seconds:.2f}x the "
                     f"default {tuning.spell(default)}; {measured})"
                     + (f"; refused: {'; '.join(refused)}" if refused else ""))
    if recorded:
        fixture.write()
    return problems


@click.command()
@click.option("--kernels", required=True, metavar="LIBS", help="The kernel libraries whose tunable rows to tune.")
@click.option("--cases", "only", default=None, metavar="TEXT", help="Only rad-kbench's cases whose name contains TEXT.")
@click.option("--cache", "cache_file", type=click.Path(dir_okay=False), default=None,
              help="The tuning cache (default: $RADIANCE_TUNE_CACHE, else ~/.cache/radiance/tuned.json).")
@click.option("--fixture", "fixture_file", type=click.Path(dir_okay=False), default=None,
              help="rad-kbench's fixture of libref's answers (default: as rad-kbench's).")
@options.radiance_home
def main(kernels, only, cache_file, fixture_file, radiance_home):
    """Measure every legal point of the named libraries' tunable rows; keep the fastest per band."""
    try:
        fixture = Fixture.read(Path(fixture_file) if fixture_file else fixture_path(radiance_home))
        registry = Registry(radiance_home=radiance_home, kernels=kernels, kinds=(RAD_PLUGIN_KERNEL, RAD_PLUGIN_QUANT))
    except (HomeError, KernelsError, FixtureError) as error:
        raise click.ClickException(str(error)) from None
    cache = Path(cache_file) if cache_file else tuning.cache_path()
    try:
        libraries = select_libraries(registry, parse_kernels(kernels))
        cases = [case for case in default_cases() if not only or only in case.name]
        if not cases:
            raise click.ClickException(f"--cases: no case name contains {only!r}")
        problems = tune(registry, libraries, fixture, cases, cache)
    finally:
        registry.close()
    for problem in problems:
        click.echo(f"error: {problem}", err=True)
    click.echo(f"tuning cache: {cache}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
