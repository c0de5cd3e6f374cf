"""Fused rows by `replaces`: a row whose `replaces` spells the graph's chain exactly (ops and wiring)
runs in its place, only where its own library serves every link (the hierarchy is absolute), and
only in the bands it declares; anything close publishes nothing; a declaration that cannot be what
its op computes is refused at load."""

import numpy as np
import pytest

from radiance.abi import RAD_DOMAIN_HOST, RAD_DT_F32, RAD_EXTENT_TOKENS
from radiance.collectives.gate import LinkScheduler
from radiance.engine.running.host import HostExecutor
from radiance.engine.loading.registry import Registry
from radiance.engine.selection.resolve import resolve_graph
from radiance.engine.selection.shard import RankBuffer, RankNode

ADD_NORM = "add(residual,delta,residual)+rmsnorm(residual,w,y)"

FUSED = """
import numpy as np

def _norm(x, w, y, eps):
    scale = np.float32(1) / np.sqrt((x * x).sum(axis=1, keepdims=True, dtype=np.float32) / np.float32(x.shape[1])
                                    + np.float32(eps))
    y[:] = (x * scale) * w.reshape(-1)


def plus(a):
    first, second, y = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    y[:m] = first[:m] + second[:m]
    return RAD_OK


def norm(a):
    x, w, y = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    _norm(x[:m], w, y[:m], a.params["eps"])
    return RAD_OK


def add_norm(a):
    residual, delta, w, y = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    residual[:m] = residual[:m] + delta[:m]
    _norm(residual[:m], w, y[:m], a.params["eps"])
    CALLS.append(m)
    return RAD_OK

CALLS = []
P = lambda name, kind=RAD_P_INT: RadParamSpec(name, kind, RAD_REQUIRED, RAD_PROLE_NONE)
SCHEMAS = [RadOpSchema("t_add_norm", [RadParamSpec("M", RAD_P_INT, RAD_REQUIRED, RAD_PROLE_SEQ_CHUNK), P("n"),
                                      P("eps", RAD_P_F64), P("dtype", RAD_P_STR)], 0,
                       [RadOperandSpec("residual", RAD_OPD_INOUT, 0), RadOperandSpec("delta", RAD_OPD_IN, 0),
                        RadOperandSpec("w", RAD_OPD_WEIGHT, 1), RadOperandSpec("y", RAD_OPD_OUT, 0)], 0,
                       "residual += delta; y = rmsnorm(residual) * w")]
ROWS = [row("fused", "t_add_norm", {constraints}replaces={replaces!r}, launch=add_norm),
        {plain}]
"""
PLAIN = 'row("plus", "add", launch=plus), row("norm", "rmsnorm", launch=norm)'


def write_fuser(home, name="fuser", replaces=ADD_NORM, constraints="", plain=PLAIN):
    home.kernel(name, FUSED.format(replaces=replaces, constraints=constraints, plain=plain))


def chain(residual_out="h"):
    """add(h, t, h); rmsnorm(h, w, x), or wired otherwise."""
    return [RankNode(0, "add", "res", RAD_EXTENT_TOKENS, {"n": 8, "dtype": "f32"}, ("h", "t", residual_out)),
            RankNode(1, "rmsnorm", "norm", RAD_EXTENT_TOKENS, {"n": 8, "eps": 1e-5, "dtype": "f32"},
                     (residual_out, "norm.w", "x"))]


def graph_of(registry, nodes, max_tokens=16, **kw):
    return resolve_graph(nodes, registry, {}, RAD_DOMAIN_HOST, max_tokens, 1, accept_reference=True, **kw)


def test_an_exact_replaces_runs_in_place_of_the_chain_binding_its_operands(home):
    write_fuser(home)
    graph = graph_of(Registry(str(home.root), kernels="fuser,libref"), chain())
    (launch,) = graph.launches(3, 1)
    assert (launch.node.op, launch.node.operands, launch.node.params) == (
        "t_add_norm", ("h", "t", "norm.w", "x"), {"n": 8, "eps": 1e-5, "dtype": "f32"})
    assert launch.band.row.name == "fused" and launch.node.name == "res+norm"
    assert graph.lines() == ["res+norm|t_add_norm|[1, 16]|fuser:fused"]
    assert any("fused by fuser, replaces " + ADD_NORM in line for line in graph.report())
    without = graph_of(Registry(str(home.root), kernels="fuser,libref"), chain(), fusion=False)
    assert [launch.band.row.name for launch in without.launches(3, 1)] == ["plus", "norm"]


def test_a_replaces_that_differs_by_one_op_fuses_nothing(home):
    write_fuser(home)
    nodes = chain()
    nodes[1] = RankNode(1, "silu_mul", "act", RAD_EXTENT_TOKENS, {"n": 8, "dtype": "f32"}, ("h", "norm.w", "x"))
    graph = graph_of(Registry(str(home.root), kernels="fuser,libref"), nodes)
    assert [launch.band.row.name for launch in graph.launches(3, 1)] == ["plus", "ref_silu_mul"]
    assert graph.fusions == []
    (note,) = [note for note in graph.notes if "fuser:fused" in note]
    assert note.startswith("fusion not taken: fuser:fused") and "occurs nowhere" in note


def test_a_chain_wired_otherwise_is_not_fused_and_says_so(home):
    write_fuser(home)
    graph = graph_of(Registry(str(home.root), kernels="fuser,libref"), chain(residual_out="t"))
    assert [launch.band.row.name for launch in graph.launches(3, 1)] == ["plus", "norm"]
    (note,) = [note for note in graph.notes if "fuser:fused" in note]
    assert "wired otherwise" in note and "add(residual,delta,delta)+rmsnorm(delta,w,y)" in note


def test_a_later_librarys_fused_row_never_displaces_an_earlier_librarys_rows(home):
    home.kernel("first", "ROWS = [row('plus1', 'add'), row('norm1', 'rmsnorm')]\nSCHEMAS = []\n")
    write_fuser(home, name="second")
    graph = graph_of(Registry(str(home.root), kernels="first,second,libref"), chain())
    assert [launch.band.row.name for launch in graph.launches(3, 1)] == ["plus1", "norm1"]
    report = "\n".join(graph.report())
    assert "M=[1, 16]: the chain runs: hierarchy: first serves add at res" in report
    # the same library serving the links and offering the fusion: taken
    assert [launch.band.row.name for launch in
            graph_of(Registry(str(home.root), kernels="second,first,libref"), chain()).launches(3, 1)] == ["fused"]


def test_the_fused_row_serves_its_bands_and_the_chain_the_rest(home):
    write_fuser(home, constraints='RAD_CLE("M", 4), ')
    graph = graph_of(Registry(str(home.root), kernels="fuser,libref"), chain())
    assert [launch.band.row.name for launch in graph.launches(4, 1)] == ["fused"]
    assert [launch.band.row.name for launch in graph.launches(5, 1)] == ["plus", "norm"]
    assert graph.lines() == ["res+norm|t_add_norm|[1, 4]|fuser:fused", "res|add|[5, 16]|fuser:plus",
                             "norm|rmsnorm|[5, 16]|fuser:norm"]
    assert "M=[5, 16]: the chain runs: no fused row serves it (fuser:fused: M <= 4 does not hold" in \
        "\n".join(graph.report())


@pytest.mark.parametrize("replaces,why", [
    ("add(residual,delta,residual)+rmsnorm(residual,w)", "link 1 (rmsnorm) names 2 operands, its schema has 3"),
    ("add(delta,residual,residual)+rmsnorm(residual,w,y)", "names operands ['delta', 'residual', 'w', 'y'] in first use"),
    ("add(residual,delta,w)+rmsnorm(residual,w,y)", "operand 'residual' is in in the chain"),
    ("add(residual,delta,residual)+nope(residual,w,y)", "link 1 is op 'nope', which no loaded library declares"),
    ("add+rmsnorm", "link 'add' is not op(operand,...)"),
])
def test_a_replaces_that_cannot_be_its_op_is_refused_at_load(home, replaces, why):
    write_fuser(home, replaces=replaces)
    registry = Registry(str(home.root), kernels="libref")
    (refusal,) = [r for r in registry.refused if r.path.stem == "fuser"]
    assert "row 'fused'" in refusal.reason and why in refusal.reason, refusal.reason


def test_the_host_executor_runs_the_fused_row_and_leaves_every_operand_as_the_chain_would(home):
    write_fuser(home)
    nodes = chain()
    buffers = {name: RankBuffer(name, RAD_DT_F32, RAD_EXTENT_TOKENS, 8) for name in ("h", "t", "x")}
    outputs, calls = {}, {}
    for fusion in (True, False):
        registry = Registry(str(home.root), kernels="fuser,libref")
        graph = graph_of(registry, nodes, max_tokens=4, fusion=fusion)
        weights = FixedWeights({"norm.w": np.linspace(0.5, 1.5, 8, dtype=np.float32)})
        link = LinkScheduler()
        executor = HostExecutor(graph, buffers, {}, weights, 4, 1, 16, 1, link)
        rng = np.random.default_rng(3)
        for name in ("h", "t"):
            executor.buffers[name][:] = rng.standard_normal((4, 8), dtype=np.float32)
        executor.run(3, 1)
        outputs[fusion] = {name: executor.read_buffer(name, 3) for name in ("h", "x")}
        calls[fusion] = list(next(lib for lib in registry.hierarchy if lib.name == "fuser").module.CALLS)
        executor.release()
        link.close()
    assert calls == {True: [3], False: []}  # the fused row ran once, in the fused run only
    for name in ("h", "x"):
        np.testing.assert_allclose(outputs[True][name], outputs[False][name], rtol=2e-6, atol=1e-7)


class FixedWeights:
    """Plain f32 weights handed to rows as they are."""

    def __init__(self, arrays):
        from radiance.abi import rad_tensor
        self.arrays = {name: rad_tensor(array) for name, array in arrays.items()}
        self.planes = self.arrays

    def operand(self, name, row, geometry):
        return self.arrays[name]


def test_radiance_no_fusion_runs_every_chain_as_declared_with_the_same_tokens(tiny_model):
    """On host rows at TP 1 the worker elides the all_reduce nodes, so libr4d's fused add + rmsnorm
    row is taken (and no collective row runs); --no-fusion leaves the chain to the plain rows."""
    import subprocess
    import sys

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "radiance.tools.generate", "--model", str(tiny_model), "--prompt",
                               "hello", "--max-tokens", "6", "--temperature", "0", "--debug-selection", *extra],
                              capture_output=True, text=True, timeout=120)
    fused, plain = run(), run("--no-fusion")
    assert fused.returncode == 0 and plain.returncode == 0, (fused.stderr, plain.stderr)
    assert "fused by libr4d, replaces add(residual,x,residual)+rmsnorm(residual,w,y)" in fused.stderr
    assert "add_rmsnorm M=[1, 256] host: libr4d:r4d_add_rmsnorm" in fused.stderr
    assert " all_reduce M=" not in fused.stderr + plain.stderr  # no all_reduce node left to resolve
    assert "fused by" not in plain.stderr
    assert fused.stdout == plain.stdout and fused.stdout


def test_radiance_launch_debug_selection_prints_rank_0s_report_once(tiny_model):
    """radiance-launch --debug-selection: rank 0 prints its winners (through the launcher's stderr),
    the other ranks do not, so a TP 2 report names each fused site once."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "radiance.tools.launch", "--tp", "2", "--model", str(tiny_model),
                           "--prompt", "hello", "--max-tokens", "2", "--temperature", "0", "--debug-selection"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count("\n[sample]\n") == 1, done.stderr[-3000:]   # one report: a node's header once
    assert "fused by libr4d, replaces all_reduce(x)+add(residual,x,residual)+rmsnorm(residual,w,y)" in done.stderr
    assert "all_reduce_add_rmsnorm M=[1, 256] host: libr4d:all_reduce_add_rmsnorm_host" in done.stderr
