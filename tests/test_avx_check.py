"""rad-avx-check: a host library's rows checked at every ISA level it runs here and with its
parallel regions forced onto several threads; a level that computes otherwise is named."""

import click
import pytest

from radiance.engine.loading.registry import Registry
from radiance.tools.avx_check import check
from radiance.tools.kbench import select_libraries
from radiance.tools.kernel_cases import default_cases
from radiance.tools.kernel_fixture import Fixture

CASES = [case for case in default_cases() if case.name in ("smollm2/tp3/add/M=17", "smollm2/tp3/gemm.k/M=17",
                                                           "smollm2/tp3/gemm.k/M=1")]
ADD = [case for case in CASES if case.op == "add"]

LEVELLED = """
import numpy as np

STATE = {"level": 2, "threads": 0, "seen": []}

def avx_isa_force(level):
    if level > 2:
        return RAD_E_UNSUPPORTED
    STATE["level"] = level
    return RAD_OK

def avx_par_force(threads):
    STATE["threads"] = threads
    return RAD_OK

def add(a):
    x, b, y = (t.data for t in a.t)
    m = a.params["M"]
    STATE["seen"].append((STATE["level"], STATE["threads"]))
    np.add(x[:m], b[:m], out=y[:m])
    if STATE["level"] == {wrong_level}:
        y[3, 5] = np.nextafter(y[3, 5], np.float32(np.inf))
    return RAD_OK

SCHEMAS = []
ROWS = [row("lv_add", "add", launch=add, opd_shape=vocabulary_opd_shape("add"))]
"""


def run(home, tmp_path, library: str, cases):
    registry = Registry(radiance_home=str(home.root) if home else "", kernels=f"{library},libref")
    lines = []
    try:
        [lib] = select_libraries(registry, [library])
        [reference] = select_libraries(registry, ["libref"])
        failures, levels = check(registry, reference, lib, Fixture(tmp_path / "kernels.rkb"), cases, 4,
                                 echo=lines.append)
        return failures, levels, lines, lib.module
    finally:
        registry.close()


@pytest.mark.parametrize("wrong_level", [-1, 1])
def test_every_level_and_forced_threads_run_and_a_level_computing_otherwise_is_named(home, tmp_path, wrong_level):
    home.kernel("levelled", LEVELLED.replace("{wrong_level}", str(wrong_level)))
    failures, levels, lines, module = run(home, tmp_path, "levelled", ADD)
    assert levels == 3 and len(lines) == 6
    assert module.STATE["seen"] == [(0, 0), (0, 4), (1, 0), (1, 4), (2, 0), (2, 4)]
    assert (module.STATE["level"], module.STATE["threads"]) == (2, 0)  # left at its highest, unforced
    if wrong_level < 0:
        assert failures == []
    else:
        assert [f.split(":")[0] for f in failures] == ["level 1, regions as sized", "level 1, regions on 4 threads"]
        assert "lv_add: norm" in failures[0], failures


def test_libr4d_agrees_with_libref_at_each_of_its_builds_and_forced_onto_four_threads(tmp_path):
    failures, levels, lines, _ = run(None, tmp_path, "libr4d", CASES)
    assert levels >= 1 and failures == [], failures
    assert all("0 failed, 0 skipped" in line for line in lines), lines


def test_a_library_without_the_exports_is_refused_naming_them(home, tmp_path):
    home.kernel("plain", """
SCHEMAS = []
ROWS = [row("p_add", "add", opd_shape=vocabulary_opd_shape("add"))]
""")
    with pytest.raises(click.ClickException, match="plain does not export avx_isa_force and avx_par_force"):
        run(home, tmp_path, "plain", ADD)
