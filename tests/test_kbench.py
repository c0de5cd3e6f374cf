"""rad-kbench: each measure catches what it is meant for, on plugin libraries written into the
test's home that are wrong in one way each (docs/CHECKING.md):

- one ulp in one element the samples did not look at: the f64 norm sees it;
- every element off by half the tolerance (within it pointwise): the norm, only;
- right at every sampled place, the rest permuted (the norm unchanged): the projections;
- a device row writing one byte past its output on the fake card: the red zone;
- a fused row one bit off its chain: the memcmp of `replaces`.

libref's answers are recorded once into a fixture file in tmp, as rad-kbench records them."""

import subprocess
import sys

import numpy as np
import pytest

from radiance.device.fake import FakeDevice
from radiance.engine.loading.registry import Registry
from radiance.engine.running.device_stream import EngineStream
from radiance.tools.kbench import KernelBench, select_libraries
from radiance.tools.kernel_cases import default_cases
from radiance.tools.kernel_fixture import Fixture, sampled_places
from radiance.tools.kernel_runner import Card

ADD = "smollm2/tp3/add/M=17"
GEMM = "smollm2/tp3/gemm.k/M=17"
GEMM_ADD = "smollm2/tp3/gemm_add.o/M=1"
CASES = {case.name: case for case in default_cases() if case.name in (ADD, GEMM, GEMM_ADD)}

GEMM_ROW = """
import numpy as np

def layout(weight, encoding, geometry):
    return RAD_OK

def relayout(weight, geometry):
    return rad_weight_f32(weight)

def unrelayout(stored, geometry):
    return rad_weight_from_f32(stored)

def gemm(a):
    x, w, y = (t.data for t in a.t)
    m = a.params["M"]
    y[:m] = (x[:m] @ w.T) * np.float32(SCALE)
    return RAD_OK

def add(a):
    x, b, y = (t.data for t in a.t)
    m = a.params["M"]
    np.add(x[:m], b[:m], out=y[:m])
    return RAD_OK

WEIGHTS = dict(layout=layout, relayout=relayout, unrelayout=unrelayout)
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """libref's answers to the three cases, recorded as rad-kbench records them."""
    path = tmp_path_factory.mktemp("kbench") / "kernels.rkb"
    registry = Registry(radiance_home="", kernels="libref")
    try:
        fixture = Fixture(path)
        results = KernelBench(registry, select_libraries(registry, ["libref"]), fixture).run(list(CASES.values()))
        assert results.recorded == 3 and not results.failed
        fixture.write()
    finally:
        registry.close()
    return path


def check(home, library: str, case: str, recorded, card_kernels=None):
    """One library of the test's home checked on one case: (outcome, fusions)."""
    registry = Registry(radiance_home=str(home.root), kernels=library)
    card = None
    try:
        assert not registry.refused, registry.refused
        if card_kernels is not None:
            device = FakeDevice(card_kernels)
            card = Card(device, EngineStream(device))
        bench = KernelBench(registry, select_libraries(registry, [library]), Fixture.read(recorded), strict=True,
                            card=card)
        results = bench.run([CASES[case]])
        assert not results.stale, results.stale
        [outcome] = results.outcomes
        return outcome, results.fusions
    finally:
        if card is not None:
            card.close()
        registry.close()


def measures(outcome) -> set:
    return {measure for measure, _ in outcome.failures}


def sampled(recorded, case: str, operand: int) -> list[int]:
    return sampled_places(Fixture.read(recorded).cases[case]["outputs"][str(operand)])


def test_a_correct_library_passes_every_measure(home, recorded):
    home.kernel("right", GEMM_ROW.replace("SCALE", "1") + """
SCHEMAS = []
ROWS = [row("right_gemm", "gemm", launch=gemm, opd_shape=vocabulary_opd_shape("gemm"), **WEIGHTS),
        row("right_add", "add", launch=add, opd_shape=vocabulary_opd_shape("add"))]
""")
    for case in (ADD, GEMM):
        outcome, _ = check(home, "right", case, recorded)
        assert outcome.passed, outcome


def test_one_ulp_in_one_unsampled_element_is_caught_by_the_norm(home, recorded):
    places = sampled(recorded, ADD, 2)
    index = next(i for i in range(100, 10000) if i not in places)
    home.kernel("nudged", GEMM_ROW.replace("SCALE", "1") + f"""
def nudged(a):
    add(a)
    flat = a.t[2].data.reshape(-1)
    flat[{index}] = np.nextafter(flat[{index}], np.float32(np.inf))
    return RAD_OK

SCHEMAS = []
ROWS = [row("nudged_add", "add", launch=nudged, opd_shape=vocabulary_opd_shape("add"))]
""")
    outcome, _ = check(home, "nudged", ADD, recorded)
    assert "norm" in measures(outcome) and "samples" not in measures(outcome), outcome.failures


def test_every_element_off_by_half_the_tolerance_is_caught_by_the_norm_alone(home, recorded):
    home.kernel("scaled", GEMM_ROW.replace("SCALE", "1.0001") + """
SCHEMAS = []
ROWS = [row("scaled_gemm", "gemm", launch=gemm, opd_shape=vocabulary_opd_shape("gemm"), **WEIGHTS)]
""")
    outcome, _ = check(home, "scaled", GEMM, recorded)
    assert measures(outcome) == {"norm"}, outcome.failures


def test_right_where_sampled_but_permuted_elsewhere_is_caught_by_the_projections(home, recorded):
    places = sampled(recorded, ADD, 2)
    home.kernel("permuted", GEMM_ROW.replace("SCALE", "1") + f"""
def permuted(a):
    add(a)
    flat = a.t[2].data.reshape(-1)
    elsewhere = np.ones(flat.size, bool)
    elsewhere[{places}] = False
    flat[elsewhere] = flat[elsewhere][::-1].copy()
    return RAD_OK

SCHEMAS = []
ROWS = [row("permuted_add", "add", launch=permuted, opd_shape=vocabulary_opd_shape("add"))]
""")
    outcome, _ = check(home, "permuted", ADD, recorded)
    assert measures(outcome) == {"projections"}, outcome.failures


DEVICE_ADD = """
SOURCE = 'extern "C" __global__ void dev_add(const float* a, const float* b, float* y, long n) {{ }}'

def dev_add(a):
    x, b, y = a.t
    n = a.params["M"] * a.params["n"]
    kernel = a.stream.kernel(SOURCE, "dev_add")
    a.stream.launch(kernel, (1,), (1,), KernelArgs("dev_add").pointer(x.data).pointer(b.data).pointer(y.data)
                    .i64(n).pack())
    return RAD_OK

SCHEMAS = []
ROWS = [row("dev_add", "add", launch=dev_add, domain=RAD_DOMAIN_DEVICE, opd_shape=vocabulary_opd_shape("add"))]
"""


def fake_add(overrun: int):
    """The fake card's dev_add: y = a + b over n floats, and `overrun` bytes after y written."""
    import struct

    def run(device, launch):
        a, b, y, n = struct.unpack("<QQQq", launch.args.data)
        device.view(y, n, np.float32)[:] = device.view(a, n, np.float32) + device.view(b, n, np.float32)
        if overrun:
            device.view(y + 4 * n, overrun)[:] = 0
    return run


@pytest.mark.parametrize("overrun", [0, 1])
def test_a_device_row_writing_one_byte_past_its_output_is_caught_by_the_red_zone(home, recorded, overrun,
                                                                                 monkeypatch, tmp_path):
    monkeypatch.setenv("RADIANCE_KERNEL_CACHE", str(tmp_path / "kernels"))
    home.kernel("devlib", DEVICE_ADD)
    outcome, _ = check(home, "devlib", ADD, recorded, card_kernels={"dev_add": fake_add(overrun)})
    if overrun:
        assert measures(outcome) == {"red zone"}, outcome.failures
        assert "operand 'y' written 1 byte(s) past its end" in outcome.failures[0][1]
    else:
        assert outcome.passed, outcome.failures


def fake_scaled_add(scale: float):
    """The fake card's dev_add, its sums off by a factor: y = (a + b) * scale, rounded to f32."""
    import struct

    def run(device, launch):
        a, b, y, n = struct.unpack("<QQQq", launch.args.data)
        total = device.view(a, n, np.float32) + device.view(b, n, np.float32)
        device.view(y, n, np.float32)[:] = (total.astype(np.float64) * scale).astype(np.float32)
    return run


@pytest.mark.parametrize("scale,stated,passes", [
    (1.0005, "4e-3", True),   # 5e-4 off: inside the 4e-3 the row states (the norm's share, 1e-3, too)
    (1.0005, None, False),    # the same row stating nothing: add's tolerance, 0 (the same bits)
    (1.02, "4e-3", False),    # 2e-2 off: outside what it states
])
def test_a_device_row_is_held_to_the_tolerance_it_states(home, recorded, monkeypatch, tmp_path, scale, stated,
                                                         passes):
    """rad_kernel_tolerance (a tensor-core row's 4e-3, say) replaces its op's tolerance for that row
    alone, on the fake card as on a card; the report notes it."""
    monkeypatch.setenv("RADIANCE_KERNEL_CACHE", str(tmp_path / "kernels"))
    statement = f"\ndef rad_kernel_tolerance(i):\n    return {stated}\n" if stated else ""
    home.kernel("loose", DEVICE_ADD + statement)
    outcome, _ = check(home, "loose", ADD, recorded, card_kernels={"dev_add": fake_scaled_add(scale)})
    assert outcome.passed == passes, outcome.failures
    if stated:
        assert "held to its own tolerance 0.004 (rad_kernel_tolerance), add's being 0" in outcome.notes
    if not passes:  # a bias every element shares: the norm is the measure for it
        assert "norm" in measures(outcome), outcome.failures


def test_libr4d_tensor_core_rows_state_the_tolerances_docs_give_them():
    """docs/OPS.md's device rows outside their op's tolerance state theirs; every other row states none."""
    registry = Registry(radiance_home="", kernels="libr4d")
    try:
        [library] = select_libraries(registry, ["libr4d"])
        stated = {row.name: row.tolerance for row in library.rows if row.tolerance is not None}
    finally:
        registry.close()
    assert stated == {"r4dchain_gemm_tc_bf16_dev": 4e-3, "r4dchain_gemm_tc_fp8_dev": 6e-2,
                      "r4dchain_attention_tc_dev": 3e-2, "r4dchain_add_rmsnorm_gemm3_tc_dev": 4e-3,
                      "r4dchain_rmsnorm_gemm3_tc_dev": 4e-3, "r4dchain_add_rmsnorm_gemm2_silu_mul_tc_dev": 8e-3,
                      "r4dchain_rmsnorm_gemm2_silu_mul_tc_dev": 8e-3}, stated


@pytest.mark.parametrize("flip", [0, 1])
def test_a_fused_row_one_bit_off_its_chain_fails_the_memcmp(home, recorded, flip):
    home.kernel("fusedlib", GEMM_ROW.replace("SCALE", "1") + f"""
def gemm_add(a):
    x, w, y, residual = a.t
    gemm(RadArgs(t=(x, w, y), params=a.params))
    add(RadArgs(t=(residual, y, residual), params=a.params))
    residual.data.view(np.uint32)[0, 0] ^= {flip}
    return RAD_OK

SCHEMAS = []
ROWS = [row("fl_gemm", "gemm", launch=gemm, opd_shape=vocabulary_opd_shape("gemm"), **WEIGHTS),
        row("fl_add", "add", launch=add, opd_shape=vocabulary_opd_shape("add")),
        row("fl_gemm_add", "gemm_add", launch=gemm_add, opd_shape=vocabulary_opd_shape("gemm_add"),
            replaces="gemm(x,w,y)+add(residual,y,residual)", **WEIGHTS)]
""")
    outcome, fusions = check(home, "fusedlib", GEMM_ADD, recorded)
    assert outcome.passed, outcome.failures  # one bit is well inside gemm_add's tolerance of libref
    [fusion] = fusions
    if flip:
        assert fusion.difference == "operand 'residual' differs in 1 byte(s), the first at byte 0", fusion
    else:
        assert fusion.difference is None and fusion.skip is None, fusion


def test_a_row_without_opd_shape_is_skipped_with_the_reason(home, recorded):
    home.kernel("shapeless", GEMM_ROW.replace("SCALE", "1") + """
SCHEMAS = []
ROWS = [row("shapeless_add", "add", launch=add)]
""")
    outcome, _ = check(home, "shapeless", ADD, recorded)
    assert outcome.skip == "no opd_shape" and not outcome.failures


def test_the_cli_records_reports_and_with_strict_fails_a_stale_fixture(tmp_path):
    fixture, report = tmp_path / "kernels.rkb", tmp_path / "report.md"
    command = [sys.executable, "-m", "radiance.tools.kbench", "--kernels", "libr4d,libref", "--fixture",
               str(fixture), "--cases", "smollm2/tp3/add/M=17", "--radiance-home", ""]
    strict = subprocess.run(command + ["--strict"], capture_output=True, text=True)
    assert strict.returncode == 1 and "STALE smollm2/tp3/add/M=17: not recorded" in strict.stdout, strict.stdout
    assert not fixture.exists()
    first = subprocess.run(command + ["--report", str(report)], capture_output=True, text=True)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "1 recorded into" in first.stdout and fixture.exists()
    text = report.read_text()
    assert "| add | 1 | 1/1 | 1/1 |" in text, text
    again = subprocess.run(command + ["--strict"], capture_output=True, text=True)
    assert again.returncode == 0 and "0 recorded" in again.stdout, again.stdout


def test_a_fixture_that_is_not_one_is_one_line_naming_it_and_left_as_it_was(tmp_path):
    fixture = tmp_path / "kernels.rkb"
    fixture.write_text("not json")
    result = subprocess.run([sys.executable, "-m", "radiance.tools.kbench", "--kernels", "libref", "--fixture",
                             str(fixture), "--cases", ADD, "--radiance-home", ""], capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].startswith(f"Error: {fixture}: not a rad-kbench fixture"), result.stderr
    assert fixture.read_text() == "not json" and sorted(p.name for p in tmp_path.iterdir()) == ["kernels.rkb"]


def test_the_docs_state_the_tolerance_every_op_is_held_to():
    """docs/CHECKING.md's table names each op of kernel_fixture.TOLERANCE with its figure."""
    import re
    from pathlib import Path

    from radiance.tools.kernel_fixture import TOLERANCE
    text = (Path(__file__).parents[1] / "docs" / "CHECKING.md").read_text()
    stated = {}
    for ops, figure in re.findall(r"^ *\| ([a-z_, ]+) \| (0|[0-9.e-]+) \|", text, re.M):
        for op in ops.split(", "):
            stated[op] = float(figure)
    fused = {op for op in TOLERANCE if op not in stated}
    assert fused == {"add_rmsnorm", "gemm_add", "rmsnorm_gemm3", "rmsnorm_gemm2", "rmsnorm_gemm2_silu_mul", "rope_attention",
                     "take_rows_rmsnorm_gemm_sample", "add_rmsnorm_gemm3", "add_rmsnorm_gemm2_silu_mul"}, fused  # "fused ops: their links' loosest"
    assert {op: TOLERANCE[op] for op in stated} == stated
    assert TOLERANCE["gemm_add"] == max(TOLERANCE["gemm"], TOLERANCE["add"])
    assert TOLERANCE["add_rmsnorm"] == max(TOLERANCE["add"], TOLERANCE["rmsnorm"])
    assert TOLERANCE["rope_attention"] == max(TOLERANCE["rope"], TOLERANCE["attention"])


def test_the_device_path_runs_every_kind_of_operand_on_the_fake_card(tmp_path, monkeypatch):
    """fakedev's device rows (every op, and gemm_add fused; each kernel runs libref's row over the
    fake card's memory) checked on the card: weights uploaded as the rows' layouts ask, paged caches,
    red zones around every allocation, the fused row against its chain on the card."""
    from radiance.abi import vocabulary_opd_shape
    from test_device_executor import fake_card, fake_home

    monkeypatch.setenv("RADIANCE_KERNEL_CACHE", str(tmp_path / "kernels"))
    names = ("smollm2/tp3/rmsnorm/M=17", "smollm2/tp3/gemm.k/M=1", "smollm2/tp3/attention/M=17",
             "smollm2/tp3/rope/M=17", "smollm2/tp3/gemm_add.o/M=17", "smollm2/tp3/take_rows/M=17")
    cases = [case for case in default_cases() if case.name in names]
    registry = Registry(radiance_home=fake_home(tmp_path, fused=True), kernels="fakedev,libref")
    try:
        [library] = select_libraries(registry, ["fakedev"])
        for row in library.rows:
            row.info.opd_shape = vocabulary_opd_shape(row.op)
        device = fake_card(registry)
        card = Card(device, EngineStream(device))
        try:
            results = KernelBench(registry, [library], Fixture(tmp_path / "kernels.rkb"), card=card).run(cases)
        finally:
            card.close()
    finally:
        registry.close()
    assert len(results.outcomes) == len(cases)
    assert all(o.passed for o in results.outcomes), [(o.case, o.skip, o.failures) for o in results.outcomes]
    [fusion] = results.fusions
    assert fusion.difference is None and fusion.skip is None, fusion


def test_a_chain_link_reads_a_parameter_the_fused_case_names_by_another_extent():
    """rmsnorm_gemm2_silu_mul's case names no `n` for its silu_mul link (its `n.0` is the rmsnorm's):
    the link reads it off the extent its `gate` shares with the fused op's, N.1. (Found on an H200:
    libr4d's silu_mul device row failed with KeyError 'n' in the chain check.)"""
    from radiance.engine.loading.replaces import parse_chain
    from radiance.tools.kbench import link_params

    registry = Registry(kernels="libref")
    try:
        [case] = [c for c in default_cases() if c.name == "smollm2/tp1/rmsnorm_gemm2_silu_mul.ffn/M=1"]
        [fused_row] = [r for lib in registry.hierarchy for r in lib.rows if r.info.replaces
                       and r.info.op == "rmsnorm_gemm2_silu_mul"][:1]
        chain = parse_chain(fused_row.info.replaces)
        links = [link_params(case.params, case.op, op, slots, registry.ops[op].schema, i)
                 for i, (op, slots) in enumerate(zip(chain.ops, chain.slots))]
    finally:
        registry.close()
    assert list(chain.ops) == ["rmsnorm", "gemm", "gemm", "silu_mul"]
    assert links[0]["n"] == case.params["n.0"] == 576
    assert links[1]["N"] == links[2]["N"] == links[3]["n"] == case.params["N.1"] == 1536
