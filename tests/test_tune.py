"""rad-tune: a row's tunables measured point by point (the cross product, less what tune_valid
refuses and what disagrees with libref), the fastest kept per band in the cache selection reads,
reaching the row as a parameter; a default point that does not launch is an error naming the row."""

from radiance.abi import RAD_E_INVALID
from radiance.engine.loading.registry import Registry
from radiance.engine.selection.bands import describe_resolution, resolve
from radiance.tools.kbench import select_libraries
from radiance.tools.kernel_cases import default_cases
from radiance.tools.kernel_fixture import Fixture
from radiance.tools.tune import tune

CASE = "smollm2/tp3/add/M=17"

TUNED_ADD = """
import time
import numpy as np

def add(a):
    x, b, y = (t.data for t in a.t)
    m, unroll = a.params["M"], a.params["unroll"]
    if unroll == {failing}:
        return RAD_E_INVALID
    time.sleep(0.004 if unroll == 1 else 0.0005)  # unroll=2 is the fast point
    np.add(x[:m], b[:m], out=y[:m])
    if unroll == 8:
        y[0, 0] += 1  # fast and wrong: no survivor
    return RAD_OK

def tune_valid(geometry):
    return not (geometry["unroll"] == 4 and geometry["M"] > 8)

SCHEMAS = []
ROWS = [row("tuned_add", "add", launch=add, opd_shape=vocabulary_opd_shape("add"), tune_valid=tune_valid,
            tunables=[RadTunable("unroll", "1,2,4,8", 1)])]
"""


def run_tune(home, tmp_path, failing=0):
    home.kernel("tunelib", TUNED_ADD.format(failing=failing))
    registry = Registry(radiance_home=str(home.root), kernels="tunelib")
    lines = []
    try:
        cases = [case for case in default_cases() if case.name == CASE]
        problems = tune(registry, select_libraries(registry, ["tunelib"]), Fixture(tmp_path / "kernels.rkb"), cases,
                        tmp_path / "tuned.json", echo=lines.append)
    finally:
        registry.close()
    return problems, lines


def test_the_fastest_legal_right_point_is_kept_and_reaches_the_row_as_a_parameter(home, tmp_path, monkeypatch):
    problems, lines = run_tune(home, tmp_path)
    assert problems == []
    [line] = lines
    assert "tunelib:tuned_add: unroll=2 (" in line and "unroll=4: tune_valid" in line, line
    assert "unroll=8: 'y' fails norm" in line, line
    monkeypatch.setenv("RADIANCE_TUNE_CACHE", str(tmp_path / "tuned.json"))
    registry = Registry(radiance_home=str(home.root), kernels="tunelib")
    try:
        geometry = {"n": 576, "dtype": "f32"}
        rows = [row for row in registry.rows_for("add") if row.plugin.name == "tunelib"]
        resolution = resolve("add", registry.ops["add"].schema, rows, geometry, {}, 1, 64)
        [band] = resolution.bands  # one row: one band, tuned at M=17
        assert band.geometry["unroll"] == 2
        text = "\n".join(describe_resolution(resolution))
        assert "tunelib:tuned_add, tuned unroll=2 (rad-tune: " in text and "against the default's" in text, text
        other = resolve("add", registry.ops["add"].schema, rows, {"n": 64, "dtype": "f32"}, {}, 1, 64)
        assert other.bands[0].geometry["unroll"] == 1 and "(default)" in other.bands[0].tuned  # not tuned there
    finally:
        registry.close()


def test_a_default_point_that_does_not_launch_is_an_error_naming_the_row(home, tmp_path):
    problems, lines = run_tune(home, tmp_path, failing=1)
    assert lines == []
    assert problems == [f"tunelib:tuned_add: its default point unroll=1 does not pass at {CASE}: status: "
                        f"launch returned {RAD_E_INVALID}"], problems
    assert not (tmp_path / "tuned.json").exists()


def test_a_row_whose_default_point_is_not_legal_at_a_band_loses_it_naming_why(home):
    home.kernel("sklib", """
def tune_valid(geometry):
    return geometry["N"] % geometry["sk"] == 0

SCHEMAS = []
ROWS = [row("split", "gemm", RAD_CEQ("split_k", 1), tune_valid=tune_valid, tunables=[RadTunable("sk", "1 2 4", 4)]),
        row("plain", "gemm", RAD_CEQ("split_k", 1), priority=-1)]
""")
    registry = Registry(radiance_home=str(home.root), kernels="sklib")
    try:
        rows = [row for row in registry.rows_for("gemm") if row.plugin.name == "sklib"]
        geometry = {"K": 64, "wdtype": "f32", "dtype": "f32"}
        legal = resolve("gemm", registry.ops["gemm"].schema, rows, {**geometry, "N": 16}, {}, 1, 8)
        assert legal.bands[0].row.name == "split" and legal.bands[0].geometry["sk"] == 4
        illegal = resolve("gemm", registry.ops["gemm"].schema, rows, {**geometry, "N": 18}, {}, 1, 8)
        assert illegal.bands[0].row.name == "plain"
        assert ("its tunables' default point sk=4 is not legal here (tune_valid)"
                in [why for row, why in illegal.bands[0].losers if row.name == "split"])
    finally:
        registry.close()
