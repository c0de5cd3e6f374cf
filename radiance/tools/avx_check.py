"""rad-avx-check --ref libref --avx libr4d: a host kernel library checked without a card, op by op,
at every ISA level it can run here and with its parallel regions forced onto several threads.

The library exports `avx_isa_force(level)` (RAD_OK, or RAD_E_UNSUPPORTED past the levels this CPU
runs; levels counted from 0, the most portable) and `avx_par_force(threads)` (0: regions sized as
usual). At each level, unforced and forced, its rows run rad-kbench's host cases against the
reference library's recorded answers (kbench.py's measures and tolerances, red zones, replaces by
memcmp). The library is left at its highest level, unforced."""

import sys
from pathlib import Path

import click

from radiance.abi import RAD_OK, RAD_PLUGIN_KERNEL, RAD_PLUGIN_QUANT
from radiance.engine.loading.homes import HomeError
from radiance.engine.loading.registry import KernelsError, Registry

from . import options
from .kbench import KernelBench, fixture_path, select_libraries
from .kernel_cases import default_cases
from .kernel_fixture import Fixture, FixtureError

MAX_LEVELS = 16
EXPORTS = ("avx_isa_force", "avx_par_force")


def check(registry, reference, library, fixture, cases, threads: int, echo=click.echo) -> tuple[list, int]:
    """(every failure line, the levels run)."""
    force_isa, force_par = (library.export(name) for name in EXPORTS)
    if force_isa is None or force_par is None:
        missing = " and ".join(name for name in EXPORTS if library.export(name) is None)
        raise click.ClickException(f"{library.path}: {library.name} does not export {missing}")
    levels = [level for level in range(MAX_LEVELS) if force_isa(level) == RAD_OK]
    if not levels:
        raise click.ClickException(f"{library.name}: avx_isa_force accepted no level")
    failures = []
    try:
        for level in levels:
            force_isa(level)
            for par in (0, threads):
                force_par(par)
                results = KernelBench(registry, [library], fixture, reference=reference).run(cases)
                failed = [o for o in results.outcomes if o.failures]
                fused = [f for f in results.fusions if f.difference]
                where = f"level {level}, {'regions on ' + str(par) + ' threads' if par else 'regions as sized'}"
                failures += [f"{where}: {o.case} {o.row}: " + "; ".join(f"{m}: {w}" for m, w in o.failures)
                             for o in failed]
                failures += [f"{where}: fusion {f.case} {f.row}: {f.difference}" for f in fused]
                failures += [f"{where}: {name}: {why}" for name, why in results.unrecorded]
                echo(f"{library.name} {where}: {len(results.outcomes)} row runs, {len(failed) + len(fused)} failed, "
                     f"{sum(o.skip is not None for o in results.outcomes)} skipped")
    finally:
        force_isa(levels[-1])
        force_par(0)
    return failures, len(levels)


@click.command()
@click.option("--ref", "ref", required=True, metavar="LIB", help="The reference library (a name or a path).")
@click.option("--avx", "avx", required=True, metavar="LIB", help="The host library to check (a name or a path).")
@click.option("--threads", default=4, show_default=True, help="Threads every parallel region is forced onto.")
@click.option("--cases", "only", default=None, metavar="TEXT", help="Only rad-kbench's cases whose name contains TEXT.")
@click.option("--fixture", "fixture_file", type=click.Path(dir_okay=False), default=None,
              help="rad-kbench's fixture of the reference's answers (default: as rad-kbench's).")
@options.radiance_home
def main(ref, avx, threads, only, fixture_file, radiance_home):
    """Check a host kernel library at every ISA level and with forced parallel regions; exit 1 on any failure."""
    try:
        fixture = Fixture.read(Path(fixture_file) if fixture_file else fixture_path(radiance_home))
        registry = Registry(radiance_home=radiance_home, kernels=f"{avx},{ref}", kinds=(RAD_PLUGIN_KERNEL, RAD_PLUGIN_QUANT))
    except (HomeError, KernelsError, FixtureError) as error:
        raise click.ClickException(str(error)) from None
    try:
        [library] = select_libraries(registry, [avx], "--avx")
        [reference] = select_libraries(registry, [ref], "--ref")
        cases = [case for case in default_cases() if not only or only in case.name]
        if not cases:
            raise click.ClickException(f"--cases: no case name contains {only!r}")
        failures, levels = check(registry, reference, library, fixture, cases, threads)
    finally:
        registry.close()
    fixture.write()
    for failure in failures:
        click.echo(f"FAIL {failure}")
    click.echo(f"{levels} ISA level(s) x 2 thread settings, {len(cases)} cases: {len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
