"""The row family of the device collectives (allreduce_fused.cu: the all-reduce with f32 or bf16 on
the wire, and the fused all_reduce + residual add + rmsnorm), what needs no card: the source against
its host mirrors, the nvrtc compile the engine runs (where nvrtc is installed), the numpy mirror of
the arithmetic against a transliteration of the CUDA, the word layout, the rows' declarations, and
where selection takes the fused row. Multi-process runs on fake cards: test_device_fused_fake.py and
test_fake_card_fused.py; on a card: test_device_fused_card.py."""

import ast
import re

import ml_dtypes
import numpy as np
import pytest

from radiance.abi import RAD_C_EQ, RAD_DOMAIN_DEVICE, RAD_FACT_P2P, RAD_MAX_KERNEL_ARG_BYTES
from radiance.collectives import device_p2p, device_rows_family as family, device_rows_mirror as mirror
from radiance.config import Config
from radiance.engine.loading.model import open_model
from radiance.engine.loading.registry import Registry
from radiance.engine.selection.resolve import resolve_graph
from radiance.engine.selection.shard import Shard, shard_nodes
from radiance.plugins.kernels.libr4d import collectives

F32 = np.float32


def code_of(text: str) -> str:
    return "\n".join(line.split("//")[0] for line in text.splitlines())


# ---- the source ------------------------------------------------------------------------------------

def test_the_source_and_its_host_mirror_agree():
    constants = family.source_constants()
    assert {name: constants[name] for name in ("PIECE", "STAGE_FLOATS", "BATCH")} == {
        "PIECE": family.PIECE, "STAGE_FLOATS": family.STAGE_FLOATS, "BATCH": family.BATCH}
    entries = dict(re.findall(r"^RAD_ROWS_ENTRY\((\w+), (\w+)\)", family.SOURCE_PATH.read_text(), re.M))
    assert entries == {family.KERNEL["f32"]: "float", family.KERNEL["bf16"]: "u16"}
    # the module DeviceP2P compiles: the rmsnorm rows' helpers, allreduce.cu, then this file
    module = device_p2p.module_source()
    assert module.index("r4d_row_squares(const float* row") < module.index("struct RadP2PPeers") \
        < module.index("RAD_ROWS_ENTRY(rad_all_reduce_rows_f32")


def test_the_words_move_at_system_scope_and_nothing_forbidden_is_used():
    code = code_of(family.SOURCE_PATH.read_text())
    assert "st.relaxed.sys.global.u64" in code and "ld.relaxed.sys.global.u64" in code
    assert code.count("__HIP_MEMORY_SCOPE_SYSTEM") == 2                        # the HIP spellings
    assert "r4d_row_squares(row, (int)n)" in code                              # the rmsnorm rows' own order
    assert "1.0f / sqrtf(squares / (float)(int)n + eps)" in code and "(row[c] * scale) * w[c]" in code
    for forbidden in ("printf", "multimem", "Multicast", "#include", "atomicAdd((u32*)(peers.base"):
        assert forbidden not in code
    # atomics only on this card's own words (peers.local), never on mapped or peer memory
    assert re.findall(r"\batomic[A-Z]\w*\((?:\(u32\*\))?(\w+)", code) == ["error", "arrive", "arrive"]
    assert "(local + RAD_P2P_ERROR_OFF)" in code and "(local + RAD_P2P_ARRIVE_OFF)" in code
    assert "(local + RAD_P2P_ERROR_OFF)" in code and "(local + RAD_P2P_ARRIVE_OFF)" in code


def _nvrtc_reason():
    try:
        from cuda.bindings import nvrtc
        nvrtc.nvrtcVersion()
    except Exception as error:  # not installed, or its library is missing
        return f"nvrtc is not available here (cuda-bindings + nvidia-cuda-nvrtc): {type(error).__name__}: {error}"
    return None


@pytest.mark.skipif(_nvrtc_reason() is not None, reason=str(_nvrtc_reason()))
@pytest.mark.parametrize("options", [(), ("-DRAD_P2P_HOST_MAPPED=1",)], ids=["p2p", "host-staged"])
def test_the_module_compiles_for_hopper_as_the_engine_compiles_it_without_spills(options):
    """The device layer's nvrtc options (radiance/device/cuda.py: the card's sm, C++17, no FMA), plus
    ptxas' report: every kernel of the row family in 64 registers (2 blocks of 512 a multiprocessor)
    without spilling, and the LL words as strong system-scope 8-byte accesses."""
    from cuda.bindings import nvrtc
    program = nvrtc.nvrtcCreateProgram(device_p2p.module_source().encode(), b"radiance.cu", 0, [], [])[1]
    try:
        flags = [b"--gpu-architecture=sm_90", b"--std=c++17", b"--fmad=false", b"--ptxas-options=-v",
                 *(o.encode() for o in options)]
        (err,) = nvrtc.nvrtcCompileProgram(program, len(flags), flags)
        log = bytearray(nvrtc.nvrtcGetProgramLogSize(program)[1])
        nvrtc.nvrtcGetProgramLog(program, log)
        log = bytes(log).decode(errors="replace")
        assert int(err) == 0, log
        ptx = bytearray(nvrtc.nvrtcGetPTXSize(program)[1])
        nvrtc.nvrtcGetPTX(program, ptx)
        ptx = bytes(ptx).decode(errors="replace")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    for name in family.KERNELS + device_p2p.KERNELS:
        assert f".entry {name}(" in ptx, name
    assert "st.relaxed.sys.global.u64" in ptx and "ld.relaxed.sys.global.u64" in ptx
    assert "griddepcontrol.launch_dependents" in ptx and "vprintf" not in ptx
    for name in family.KERNELS:
        report = log.split(f"Function properties for {name}")[1].split("Compile time")[0]
        assert "0 bytes spill stores, 0 bytes spill loads" in report, report
        assert int(re.search(r"Used (\d+) registers", report)[1]) <= 64, report


# ---- the arithmetic's mirror ------------------------------------------------------------------------

def r4d_row_squares_by_lanes(row):
    """common.cu's r4d_row_squares written out as the CUDA runs it: 32 lanes, each a sequential f32
    sum of its chunks' squares, then the butterfly (every lane ends with the same total)."""
    n = row.size
    lanes = [F32(0.0)] * 32
    for lane in range(32):
        total = F32(0.0)
        for c in range(lane * 4, n, 32 * 4):
            for i in range(c, min(c + 4, n)):
                total = F32(total + F32(row[i] * row[i]))
        lanes[lane] = total
    for offset in (16, 8, 4, 2, 1):
        lanes = [F32(lanes[i] + lanes[i ^ offset]) for i in range(32)]
    assert len({float(v) for v in lanes}) == 1
    return lanes[0]


@pytest.mark.parametrize("n", [1, 3, 4, 64, 127, 128, 129, 576, 1000, 4096])
def test_the_mirror_sums_squares_in_the_rmsnorm_rows_order(n):
    rng = np.random.default_rng(n)
    row = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(F32)
    assert mirror.row_squares(row).view(np.uint32) == r4d_row_squares_by_lanes(row).view(np.uint32)


def test_the_mirror_rounds_to_bf16_as_the_kernel_does():
    rng = np.random.default_rng(5)
    values = np.concatenate([(rng.standard_normal(10000) * np.exp2(rng.integers(-130, 120, 10000))).astype(F32),
                             np.array([0.0, -0.0, np.inf, -np.inf, 3.3895314e38, -3.3895314e38, 1e-45], F32)])
    assert np.array_equal(mirror.bf16_bits(values), values.astype(ml_dtypes.bfloat16).view(np.uint16))
    # a NaN stays a quiet NaN with its sign and top payload bits (rad_from_f32's `| 0x40`)
    nans = np.array([0x7FC00000, 0x7F800001, 0xFFA00000], np.uint32).view(F32)
    assert list(mirror.bf16_bits(nans)) == [0x7FC0, 0x7FC0, 0xFFE0]


def test_the_mirror_sums_in_rank_order_and_rounds_each_contribution_and_the_sum_on_bf16():
    parts = [np.array([1.0, 2.0 ** -9, 1e-3], F32), np.array([2.0 ** -8 + 2.0 ** -16, 1.0, 3.0], F32)]
    assert np.array_equal(mirror.rank_order_sum(parts, "f32"), parts[0] + parts[1])
    bf = mirror.rank_order_sum(parts, "bf16")
    rounded = [p.astype(ml_dtypes.bfloat16).astype(F32) for p in parts]
    assert np.array_equal(bf, (rounded[0] + rounded[1]).astype(ml_dtypes.bfloat16).astype(F32))
    assert not np.array_equal(bf, parts[0] + parts[1])


# ---- the layout -------------------------------------------------------------------------------------

@pytest.mark.parametrize("wire", family.WIRES)
@pytest.mark.parametrize("m,n,rows,blocks", [(1, 4096, True, 1), (5, 577, True, 5), (3, 1, True, 3),
                                             (1, 4096, False, 1), (1, 100003, False, 25), (1, 7, False, 1)])
def test_units_cover_the_message_once_and_their_words_never_overlap(wire, m, n, rows, blocks):
    units = family.units(wire, m, n, rows, blocks)
    per = family.PER_WORD[wire]
    covered, words_seen = np.zeros(m * n, int), np.zeros(family.words(wire, m, n, rows), int)
    for lo, hi, first in units:
        covered[lo:hi] += 1
        words_seen[first:first + -(-(hi - lo) // per)] += 1
        assert rows or lo % 8 == 0
    assert covered.min() == covered.max() == 1
    assert words_seen.max() == 1


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("wire", family.WIRES)
def test_every_message_up_to_the_ll_limit_fits_the_slot_in_either_exchange(world, wire):
    buffer = 256 * 576 * 4   # SmolLM2's widest all-reduce at 256 tokens a step
    slot = device_p2p.slot_size(buffer, world)
    for m, n in ((1, 576), (56, 576), (1, 1), (family.LL_MAX_BYTES // 4, 1), (1, family.LL_MAX_BYTES // 4)):
        for rows in (True, False):
            assert family.slot_need("ll", world, family.words(wire, m, n, rows)) <= slot
    assert family.slot_need("rows", world, family.words(wire, 256, 576, True)) <= slot
    assert device_p2p.region_bytes(buffer, world) == device_p2p.CTRL_BYTES + 2 * slot


def test_grids_stage_and_arguments():
    assert family.grid(1, 4096, True, 264) == 1 and family.grid(300, 4096, True, 264) == 264
    assert family.grid(1, 4096, False, 264) == 1 and family.grid(1, 4097, False, 264) == 2
    assert family.grid(1, 1 << 30, False, 264) == 264
    assert family.stage_floats(1, 4096, 1 << 20) == 4096
    assert family.stage_floats(1, 4096, (1 << 20) + 4) == 0     # a 4-byte-aligned row sums another way
    assert family.stage_floats(1, 4097, (1 << 20) + 4) == 4097  # n % 4: the scalar path either way
    assert family.stage_floats(1, 8193, 1 << 20) == 0
    assert [family.flag(e) for e in (0, 1, 2, 0xFFFFFFFE, 0xFFFFFFFF)] == [1, 2, 3, 0xFFFFFFFF, 1]
    assert all(family.flag(e) != family.flag(e - 2) and family.flag(e) for e in (2, 3, 1 << 32, (1 << 32) + 1))
    from radiance.device import KernelArgs
    args = (KernelArgs("k").raw(bytes(72), 8).pointer(1).pointer(1).pointer(1).pointer(1).pointer(1).u64(1).u64(1)
            .i32(0).i32(2).u64(1).u64(0).u64(1).f32(1e-5).i32(1).u32(0).pack())
    # the entry's parameter list as C lays it out: the 72-byte table, 5 pointers, m, n, rank, world,
    # slot_bytes, gate, timeout_ns, eps, ll, stage
    assert args.offsets == (0, 72, 80, 88, 96, 104, 112, 120, 128, 132, 136, 144, 152, 160, 164, 168)
    assert len(args) == 172 <= RAD_MAX_KERNEL_ARG_BYTES


# ---- the rows and where selection takes them --------------------------------------------------------

FUSED_ROWS = {"all_reduce_add_rmsnorm_p2p": 1, "all_reduce_add_rmsnorm_p2p_host": 0}


@pytest.fixture(scope="module")
def registry():
    reg = Registry(radiance_home="")
    yield reg
    reg.close()


def test_the_fused_rows_are_declared_on_the_device_domain_with_colour_2(registry):
    rows = {row.name: row for row in registry.rows_for(collectives.FUSED_OP)
            if row.plugin.name == "libr4d" and row.info.domain == RAD_DOMAIN_DEVICE}
    assert set(rows) == set(FUSED_ROWS)
    for name, p2p in FUSED_ROWS.items():
        row = rows[name]
        assert row.collective == 2 and not row.chain and row.info.replaces == collectives.FUSED_REPLACES
        constraints = {(c.key, c.op, c.sval if c.sval is not None else c.ival) for c in row.info.constraints}
        assert constraints == {(RAD_FACT_P2P, RAD_C_EQ, p2p), ("dtype", RAD_C_EQ, "f32")}
        # the norm's weight an f32 vector, as the rmsnorm rows keep it (the loaded plugin is its own module)
        assert (row.info.layout.__name__, row.info.relayout.__name__) == ("layout_vector", "relayout_vector")


def _device_graph(registry, tiny_model, p2p, world=2, **options):
    model = open_model(Config(model=str(tiny_model), progress=False), registry)
    nodes = shard_nodes(model.graph, Shard(0, world))
    return resolve_graph(nodes, registry, {"device.p2p": p2p}, RAD_DOMAIN_DEVICE, 256, 2, **options)


@pytest.mark.parametrize("p2p", [1, 0])
def test_the_fusion_occurs_at_every_all_reduce_but_the_last_of_a_tp_2_llama_graph_on_cards(registry, tiny_model, p2p):
    """libr4d serves all_reduce, add and rmsnorm on the device domain, so its fused row replaces each
    all_reduce -> residual add -> next norm, in every band: only the last layer's ffn all_reduce is
    followed by no norm of its own (take_rows comes between)."""
    graph = _device_graph(registry, tiny_model, p2p)
    row = "all_reduce_add_rmsnorm_p2p" + ("" if p2p else "_host")
    fused = [line for line in graph.lines() if "|all_reduce_add_rmsnorm|" in line]
    assert fused == [f"layers.0.attn.all_reduce+layers.0.attn.residual+layers.0.ffn_norm|all_reduce_add_rmsnorm|"
                     f"[1, 256]|libr4d:{row}",
                     f"layers.0.ffn.all_reduce+layers.0.ffn.residual+layers.1.attn_norm|all_reduce_add_rmsnorm|"
                     f"[1, 256]|libr4d:{row}",
                     f"layers.1.attn.all_reduce+layers.1.attn.residual+layers.1.ffn_norm|all_reduce_add_rmsnorm|"
                     f"[1, 256]|libr4d:{row}"]
    for tokens in (1, 8, 9, 256):
        ops = [launch.node.op for launch in graph.launches(tokens, min(tokens, 2))]
        assert ops.count("all_reduce_add_rmsnorm") == 3 and ops.count("all_reduce") == 1
    off = _device_graph(registry, tiny_model, p2p, fusion=False)
    assert not [line for line in off.lines() if "all_reduce_add_rmsnorm" in line]


def test_r4d_fused_all_reduce_0_leaves_the_fused_rows_out_and_the_norms_to_the_gemvs(tiny_model):
    """The knob a measurement of the two ways needs (docs/COLLECTIVES.md): the process's environment."""
    script = f"""
import sys
from radiance.abi import RAD_DOMAIN_DEVICE
from radiance.config import Config
from radiance.engine.loading.model import open_model
from radiance.engine.loading.registry import Registry
from radiance.engine.selection.resolve import resolve_graph
from radiance.engine.selection.shard import Shard, shard_nodes
registry = Registry(radiance_home="")
model = open_model(Config(model={str(tiny_model)!r}, progress=False), registry)
graph = resolve_graph(shard_nodes(model.graph, Shard(0, 2)), registry, {{"device.p2p": 1}}, RAD_DOMAIN_DEVICE, 256, 2)
print(sorted({{launch.node.op for launch in graph.launches(1, 1)}}))
"""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "R4D_FUSED_ALL_REDUCE": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    ops = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert "all_reduce_add_rmsnorm" not in ops
    assert {"all_reduce", "add", "rmsnorm_gemm3", "rmsnorm_gemm2_silu_mul"} <= set(ops)


def test_the_fused_row_is_not_taken_where_another_library_serves_a_link(home, tiny_model):
    """The hierarchy is absolute: a library ahead of libr4d that serves add (on the device domain)
    keeps the chain unfused, and --debug-selection says why."""
    home.kernel("adder", """
ROWS = [row("dev_add", "add", domain=RAD_DOMAIN_DEVICE)]
SCHEMAS = []
""")
    registry = Registry(str(home.root), kernels="adder,libr4d,libref")
    try:
        graph = _device_graph(registry, tiny_model, 1)
        assert not [line for line in graph.lines() if "all_reduce_add_rmsnorm" in line]
        assert [line for line in graph.lines() if line.startswith("layers.0.attn.residual|")] == [
            "layers.0.attn.residual|add|[1, 256]|adder:dev_add"]
        assert "the chain runs: hierarchy: adder serves add at layers.0.attn.residual" in "\n".join(graph.report())
    finally:
        registry.close()


@pytest.mark.parametrize("asked,model,wire", [("auto", "tiny_model", "bf16"), ("auto", "smollm2", "f32"),
                                              ("f32", "tiny_model", "f32"), ("bf16", "smollm2", "bf16")])
def test_the_wire_is_bf16_for_a_bf16_model_unless_asked_otherwise(asked, model, wire, request):
    """The synthetic model's projections are bf16; SmolLM2's are Q4_1 (and its lm head Q8_0)."""
    from radiance.ranks.worker import Worker

    config = Config(model=str(request.getfixturevalue(model)), progress=False, device="host", collective_wire=asked)
    worker = Worker(config)
    try:
        assert worker.collective_wire() == wire
    finally:
        worker.model.close()
        worker.registry.close()
