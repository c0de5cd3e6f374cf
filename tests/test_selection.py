"""Row selection: hierarchy, priority, bands, facts, derived parameters, reference gating."""

import pytest

from radiance.abi import RAD_DOMAIN_HOST
from radiance.engine.loading.registry import Registry
from radiance.engine.selection.bands import SelectionError, describe_resolution, resolve


def select(registry, op, geometry=None, facts=None, max_extent=4096, accept_reference=False):
    schema = registry.ops[op].schema
    return resolve(op, schema, registry.rows_for(op), geometry or {}, facts or {}, RAD_DOMAIN_HOST,
                   max_extent, accept_reference)


def winners(resolution):
    return [(band.lo, band.hi, band.row.name) for band in resolution.bands]


def test_hierarchy_beats_priority(home):
    home.kernel("lib_a", 'SCHEMAS = [schema("t_op")]\nROWS = [row("a_plain", "t_op", priority=1)]\n')
    home.kernel("lib_b", 'SCHEMAS = [schema("t_op")]\nROWS = [row("b_special", "t_op", priority=1000)]\n')
    assert winners(select(Registry(str(home.root), kernels="lib_a,lib_b"), "t_op")) == [(1, 4096, "a_plain")]
    resolution = select(Registry(str(home.root), kernels="lib_b,lib_a"), "t_op")
    assert winners(resolution) == [(1, 4096, "b_special")]
    assert resolution.bands[0].losers[0][1] == "hierarchy: lib_b supplies this op"


def test_priority_then_declaration_order_inside_a_library(home):
    home.kernel("lib", 'SCHEMAS = [schema("t_op")]\nROWS = [row("low", "t_op", priority=1), '
                       'row("first", "t_op", priority=5), row("second", "t_op", priority=5)]\n')
    resolution = select(Registry(str(home.root)), "t_op")
    assert winners(resolution) == [(1, 4096, "first")]
    reasons = dict((row.name, why) for row, why in resolution.bands[0].losers)
    assert reasons == {"low": "priority 1 < 5", "second": "declared after first at the same priority"}


def test_bands_from_le_and_ge_boundaries(home):
    home.kernel("lib", 'SCHEMAS = [schema("t_gemm")]\nROWS = [row("small", "t_gemm", RAD_CLE("M", 64)), '
                       'row("large", "t_gemm", RAD_CGE("M", 65))]\n')
    resolution = select(Registry(str(home.root)), "t_gemm", max_extent=8192)
    assert winners(resolution) == [(1, 64, "small"), (65, 8192, "large")]
    assert resolution.band_for(64).row.name == "small" and resolution.band_for(65).row.name == "large"
    assert resolution.seq_chunk == "M"


def test_eq_cuts_a_single_value_band_and_div_makes_none(home):
    home.kernel("lib", 'SCHEMAS = [schema("t_op")]\nROWS = [row("one", "t_op", RAD_CEQ("M", 1)), '
                       'row("even", "t_op", RAD_CDIV("M", 2)), row("any", "t_op")]\n')
    assert winners(select(Registry(str(home.root)), "t_op", max_extent=100)) == [(1, 1, "one"), (2, 100, "any")]


def test_a_band_no_row_serves_names_op_and_band(home):
    home.kernel("lib", 'SCHEMAS = [schema("t_gemm")]\nROWS = [row("small", "t_gemm", RAD_CLE("M", 64))]\n')
    with pytest.raises(SelectionError, match=r"no library serves op 't_gemm' for M in \[65, 512\] on the host"):
        select(Registry(str(home.root)), "t_gemm", max_extent=512)


TWINS = """
SCHEMAS = [schema("t_all_reduce")]
ROWS = [row("all_reduce", "t_all_reduce", RAD_CEQ(RAD_FACT_P2P, 1)),
        row("all_reduce_host", "t_all_reduce", RAD_CEQ(RAD_FACT_P2P, 0))]
def rad_kernel_collective(i):
    return 1
"""


@pytest.mark.parametrize("p2p,expected", [(1, "all_reduce"), (0, "all_reduce_host")])
def test_collective_and_its_host_twin_exactly_one_matches(home, p2p, expected):
    home.kernel("coll", TWINS)
    registry = Registry(str(home.root))
    resolution = select(registry, "t_all_reduce", facts={"device.p2p": p2p})
    assert winners(resolution) == [(1, 4096, expected)]
    matching = [row for row in registry.rows_for("t_all_reduce")
                if all(c.ival == p2p for c in row.info.constraints)]
    assert [row.name for row in matching] == [expected]
    assert resolution.bands[0].losers[0][1].endswith(f"does not hold (device.p2p is {p2p})")


def test_an_unmeasured_fact_does_not_hold(home):
    home.kernel("coll", TWINS)
    with pytest.raises(SelectionError, match="no library serves op 't_all_reduce'") as error:
        select(Registry(str(home.root)), "t_all_reduce", facts={})
    assert "(coll:all_reduce: device.p2p == 1: device.p2p was not measured; coll:all_reduce_host" in str(error.value)


def test_constraint_on_a_key_the_geometry_omits_does_not_hold(home):
    home.kernel("lib", 'SCHEMAS = [schema("t_op", ("M", "dtype"))]\nROWS = [row("typed", "t_op", RAD_CIN("dtype", "bf16 f16")), '
                       'row("fallback", "t_op")]\n')
    registry = Registry(str(home.root))
    assert winners(select(registry, "t_op", {"dtype": "bf16"})) == [(1, 4096, "typed")]
    resolution = select(registry, "t_op", {})
    assert winners(resolution) == [(1, 4096, "fallback")]
    assert resolution.bands[0].losers[0][1] == "dtype in {bf16 f16}: the geometry omits dtype"


def test_derived_parameter_supplied_by_the_winner(home):
    home.kernel("lib", 'SCHEMAS = [schema("t_gemm", ("M", "N", "SPLIT"), derived=("SPLIT",))]\n'
                       'ROWS = [row("split4", "t_gemm", RAD_CEQ("SPLIT", 4), RAD_CLE("M", 16)), '
                       'row("split1", "t_gemm", RAD_CEQ("SPLIT", 1))]\n')
    resolution = select(Registry(str(home.root)), "t_gemm", {"N": 576}, max_extent=64)
    assert [(b.lo, b.hi, b.geometry) for b in resolution.bands] == [
        (1, 16, {"N": 576, "M": 16, "SPLIT": 4}), (17, 64, {"N": 576, "M": 64, "SPLIT": 1})]


REFERENCE = """
SCHEMAS = [schema("t_op")]
ROWS = [row("oracle", "t_op")]
def rad_plugin_reference():
    return 1
"""


def test_reference_rows_serve_only_when_accepted(home):
    home.kernel("oracle_lib", REFERENCE)
    registry = Registry(str(home.root))
    with pytest.raises(SelectionError, match=r"op 't_op' for M in \[1, 4096\] on the host domain: only the "
                                             r"reference row oracle_lib:oracle matches; serving from it needs "
                                             r"--debug-accept-reference-kernels"):
        select(registry, "t_op")
    assert winners(select(registry, "t_op", accept_reference=True)) == [(1, 4096, "oracle")]


def test_reference_library_ranks_last_unless_named(home):
    home.kernel("a_oracle", REFERENCE.replace("oracle\"", "ref_row\""))
    home.kernel("b_fast", 'SCHEMAS = [schema("t_op")]\nROWS = [row("fast", "t_op")]\n')
    registry = Registry(str(home.root))
    order = [lib.name for lib in registry.hierarchy]
    assert order[0] == "b_fast"
    assert all(lib.reference for lib in registry.hierarchy[order.index("a_oracle"):])
    assert winners(select(registry, "t_op", accept_reference=True)) == [(1, 4096, "fast")]
    named = Registry(str(home.root), kernels="a_oracle")
    assert winners(select(named, "t_op", accept_reference=True)) == [(1, 4096, "ref_row")]


def test_init_once_per_band_and_fini_at_teardown(home, tmp_path):
    log = tmp_path / "hooks.log"
    home.kernel("lib", f"""
def init(geometry):
    open({str(log)!r}, "a").write(f"init {{geometry['M']}}\\n")
    return geometry["M"]
def fini(instance):
    open({str(log)!r}, "a").write(f"fini {{instance}}\\n")
SCHEMAS = [schema("t_op")]
ROWS = [row("small", "t_op", RAD_CLE("M", 8), init=init, fini=fini), row("big", "t_op", init=init, fini=fini)]
""")
    resolution = select(Registry(str(home.root)), "t_op", max_extent=32)
    resolution.instantiate()
    resolution.instantiate()
    assert [band.instance for band in resolution.bands] == [8, 32]
    resolution.release()
    assert log.read_text().split("\n")[:-1] == ["init 8", "init 32", "fini 8", "fini 32"]


def test_debug_selection_names_winner_and_each_refusing_constraint(home):
    home.kernel("lib", 'SCHEMAS = [schema("t_gemm")]\nROWS = [row("small", "t_gemm", RAD_CLE("M", 64)), '
                       'row("large", "t_gemm", RAD_CGE("M", 65))]\n')
    lines = describe_resolution(select(Registry(str(home.root)), "t_gemm", max_extent=128))
    assert lines == [
        "t_gemm M=[1, 64] host: lib:small",
        "    lib:large lost: M >= 65 does not hold for M in [1, 64]",
        "t_gemm M=[65, 128] host: lib:large",
        "    lib:small lost: M <= 64 does not hold for M in [65, 128]",
    ]


def test_init_runs_after_selection_and_before_the_weights_load(home, tiny_model, monkeypatch):
    """The specification: `init` runs once per (op, band, domain) after selection and before load."""
    from radiance.engine.running import rank_weights
    from test_device_executor import generate

    home.kernel("initlib", """
import numpy as np
EVENTS = []

def init(geometry):
    EVENTS.append("init")
    return object()

def add(a):
    x, b, y = (t.data for t in a.t)
    m = a.params["M"]
    np.add(x[:m], b[:m], out=y[:m])
    return RAD_OK

SCHEMAS = []
ROWS = [row("init_add", "add", launch=add, init=init)]
""")
    registry = Registry(radiance_home=str(home.root), kernels="initlib,libref")
    events = next(lib for lib in registry.hierarchy if lib.name == "initlib").module.EVENTS
    load = rank_weights.RankWeights.__init__

    def loading(self, *args, **kwargs):
        events.append("load")
        load(self, *args, **kwargs)
    monkeypatch.setattr(rank_weights.RankWeights, "__init__", loading)
    _, worker = generate(tiny_model, registry, max_seqs=2)
    worker.close()
    assert "init" in events and events.index("init") < events.index("load"), events
