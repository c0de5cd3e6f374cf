"""Rows marked rad_kernel_concurrent overlap independent neighbours on a worker thread; a row not
so marked never overlaps anything; dependent nodes never overlap."""



from radiance.abi import RAD_DOMAIN_HOST, RAD_DT_F32, RAD_EXTENT_TOKENS
from radiance.collectives.gate import LinkScheduler
from radiance.engine.running.host import HostExecutor
from radiance.engine.loading.registry import Registry
from radiance.engine.selection.resolve import resolve_graph
from radiance.engine.selection.shard import RankBuffer, RankNode

PLUGIN = """
import time
SPANS = []

def work(a):
    start = time.monotonic()
    time.sleep(0.15)
    SPANS.append((a.params["tag"], start, time.monotonic()))
    return RAD_OK

SCHEMAS = [RadOpSchema("t_work", [RadParamSpec("M", RAD_P_INT, RAD_REQUIRED, RAD_PROLE_SEQ_CHUNK),
                                  RadParamSpec("tag", RAD_P_STR, RAD_REQUIRED, RAD_PROLE_NONE)], 0,
                       [RadOperandSpec("x", RAD_OPD_IN, 0), RadOperandSpec("y", RAD_OPD_OUT, 0)], 0, "sleeps"),
           RadOpSchema("t_serial", [RadParamSpec("M", RAD_P_INT, RAD_REQUIRED, RAD_PROLE_SEQ_CHUNK),
                                    RadParamSpec("tag", RAD_P_STR, RAD_REQUIRED, RAD_PROLE_NONE)], 0,
                       [RadOperandSpec("x", RAD_OPD_IN, 0), RadOperandSpec("y", RAD_OPD_OUT, 0)], 0, "sleeps")]
ROWS = [row("concurrent_work", "t_work", launch=work), row("serial_work", "t_serial", launch=work)]

def rad_kernel_concurrent(i):
    return 1 if ROWS[i].name == "concurrent_work" else 0
"""


def run_graph(home, nodes):
    home.kernel("sleepy", PLUGIN)
    registry = Registry(str(home.root), kernels="sleepy")
    module = registry.hierarchy[0].module
    module.SPANS.clear()
    rank_nodes = [RankNode(i, op, tag, RAD_EXTENT_TOKENS, {"tag": tag}, operands) for i, (op, tag, operands) in enumerate(nodes)]
    resolved = resolve_graph(rank_nodes, registry, {}, RAD_DOMAIN_HOST, 4, 1)
    buffers = {name: RankBuffer(name, RAD_DT_F32, RAD_EXTENT_TOKENS, 4) for name in "abcdef"}
    link = LinkScheduler()
    executor = HostExecutor(resolved, buffers, {}, None, 4, 1, 16, 1, link)
    executor.run(1, 1)
    executor.release()
    link.close()
    return {tag: (start, end) for tag, start, end in module.SPANS}


def overlaps(a, b):
    return a[0] < b[1] and b[0] < a[1]


def test_independent_concurrent_rows_overlap(home):
    spans = run_graph(home, [("t_work", "one", ("a", "b")), ("t_work", "two", ("a", "c")), ("t_work", "three", ("d", "e"))])
    assert overlaps(spans["one"], spans["two"]) and overlaps(spans["two"], spans["three"])


def test_a_reader_of_a_concurrent_rows_output_waits_for_it(home):
    spans = run_graph(home, [("t_work", "one", ("a", "b")), ("t_work", "two", ("b", "c"))])
    assert spans["two"][0] >= spans["one"][1]


def test_a_row_not_marked_concurrent_never_overlaps(home):
    spans = run_graph(home, [("t_work", "one", ("a", "b")), ("t_serial", "lone", ("d", "e")),
                             ("t_work", "two", ("a", "c"))])
    assert not overlaps(spans["lone"], spans["one"]) and not overlaps(spans["lone"], spans["two"])
