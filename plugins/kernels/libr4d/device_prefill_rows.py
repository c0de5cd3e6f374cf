"""libr4d's fused rows above the decode band (docs/LIBR4D.md "Fused rows for prefill"): the chains
[add +] rmsnorm + q, k, v and [add +] rmsnorm + gate, up + silu_mul, each one row, from TMA_FROM rows
of x, where a prefill's GEMMs are gemm_tma.cu's (with the residual add: every layer's chains but the
first's norm, which no add precedes; the engine takes a fusion at the first node it can start at,
so without it add_rmsnorm's would take the add and the norm). On Hopper (bf16, the TMA kernel's
default cut): r4d_add_rmsnorm_bf16_dev (the residual and `normed` as the chain leaves them, and the
normed values rounded to bf16 into the scratch: x narrowed once, not once a GEMM),
r4d_tma_maps_group, then one r4d_tma_gemm_bf16_group over q, k and v, or one r4d_tma_gemm_bf16_swiglu
writing up and gate = silu_mul(gate, up) (no silu_mul launch). Elsewhere (another card, another cut,
R4D_PREFILL_FUSED=0) the same row runs the chain's own launches: the add and norm, the batch rows'
GEMMs (device_batch_rows.tc_gemm_steps), silu_mul. Either way the unfused chain's bits on that card
wherever its GEMM sums K in one pass: the same norm, the same roundings to bf16, each output's sums
in the same order."""

import os

from radiance.abi import RAD_CDIV, RAD_CGE, RAD_CIN, RAD_DOMAIN_DEVICE, KernelArgs, RadKernelInfo

from . import device_kernels as dk
from . import device_tensor_cores as tc
from .device_batch_rows import PRIORITY, tc_gemm_scratch, tc_gemm_steps
from .device_formats import layout_as_stored
from .device_rows import (
    F32_ACTIVATIONS, DeviceWeight, ScratchTooSmall, Step, _address, _planned, _vendor, chained, elementwise_step,
)
from .rows import REPLACES

FROM = tc.TMA_FROM  # below it gemm_skinny.cu and the streamed GEMM serve, which fuse nothing here


def fused() -> bool:
    """Whether the rows take gemm_tma.cu's grouped forms where they serve (R4D_PREFILL_FUSED=0: the
    chain's own launches everywhere; read at each plan, so one process can time both)."""
    return os.environ.get("R4D_PREFILL_FUSED", "1") != "0"


def serves(a, swiglu: bool) -> bool:
    """gemm_tma.cu's grouped (or, `swiglu`, SwiGLU) form serves this launch: the card's GEMM at M is the
    TMA kernel, the form's cut (tc.form_cut) has it, and the forms are not turned off."""
    m = int(a.params["M"])
    return (fused() and tc.has_groups(tc.form_cut(swiglu))
            and tc.kernel_for(_vendor(a), getattr(a.stream, "target", ""), "bf16", m) == "tma")


def scratch_layout(m: int, k: int) -> dict:
    """After the split-K counters' region (tc.COUNTER_BYTES, which every row's scratch keeps): x's
    normed rows as bf16 [M, K], then four tensor maps (x's and up to three weights')."""
    rows = tc.COUNTER_BYTES
    maps = rows + -(-2 * m * k // 256) * 256
    return {"rows": rows, "maps": maps, "total": maps + 4 * tc.MAP_BYTES}


def _scratch(outputs: tuple):
    """The grouped path's layout or, where more, what the batch rows' GEMM of each weight needs."""
    def scratch(geometry) -> int:
        m, k = int(geometry["M"]), int(geometry["K"])
        gemms = [tc_gemm_scratch("bf16")({"M": m, "N": int(geometry[name]), "K": k}) for name in outputs]
        return max(scratch_layout(m, k)["total"], *gemms)
    return scratch


def _norm(a, add: bool, rows: int) -> Step:
    """[residual += x, then] normed = rmsnorm(residual or x) * norm, its bf16 values into `rows` (0: not)."""
    if add:
        residual, x, norm, normed = a.t[:4]
    else:
        residual, norm, normed = a.t[:3]
    weight, m, k = DeviceWeight(norm), int(a.params["M"]), int(a.params["K"])
    grid, block = dk.norm_grid(m, dk.warp_size(_vendor(a)))
    args = (KernelArgs("r4d_add_rmsnorm_bf16_dev").pointer(_address(residual)).pointer(_address(x) if add else 0)
            .pointer(weight.codes).i32(weight.fmt).pointer(_address(normed)).pointer(rows).i32(m).i32(k)
            .f32(a.params["eps"]))
    return Step("r4d_add_rmsnorm_bf16_dev", "elementwise", grid, block, args)


def group_steps(rows: int, maps: int, weights: list, outputs: list, m: int, k: int, swiglu: bool) -> list:
    """r4d_tma_maps_group then r4d_tma_gemm_bf16_group or r4d_tma_gemm_bf16_swiglu over x's bf16 rows
    [m, k] at `rows`: `weights` (codes address, rows) 1..3 of them (SwiGLU: gate's then up's), each
    with its f32 output (SwiGLU: gate, up), the maps written at `maps` (4 x 128 bytes, 128-aligned);
    in tc.SWIGLU_CUT for SwiGLU, else tc.TMA_CUT. The benches and the entries' own tests plan the launches here too."""
    padded = weights + [weights[0]] * (3 - len(weights))  # unread past `weights`
    counts = [weights[at][1] if at < len(weights) else 0 for at in range(3)]
    cut = tc.form_cut(swiglu)  # the maps' boxes and the GEMM's ring are its
    box = cut.cols // 2 if swiglu else cut.w_box  # a block's share of w's tile
    args = KernelArgs(tc.TMA_MAPS_GROUP).pointer(rows)
    for codes, _ in padded:
        args.pointer(codes)
    args.i32(m)
    for count in counts:
        args.i32(count)
    args.i32(len(weights)).i32(2 * k).i32(box).pointer(maps)
    steps = [Step(tc.TMA_MAPS_GROUP, "gemm_tma", (1, 1, 1), (32, 1, 1), args, 0, tc.options(tc.TMA_MAPS_GROUP, cut=cut))]
    shared = cut.shared
    if swiglu:
        gate, up = outputs
        grid, block = tc.swiglu_grid(m, counts[0])
        gemm = KernelArgs(tc.TMA_SWIGLU).pointer(maps).pointer(gate).pointer(up).i32(m).i32(counts[0]).i32(k)
        return steps + [Step(tc.TMA_SWIGLU, "gemm_tma", grid, block, gemm, shared, tc.options(tc.TMA_SWIGLU, cut=cut))]
    gemm = KernelArgs(tc.TMA_GROUP).pointer(maps)
    for y in outputs + [outputs[0]] * (3 - len(outputs)):
        gemm.pointer(y)
    gemm.i32(m)
    for count in counts:
        gemm.i32(count)
    gemm.i32(len(weights)).i32(k)
    grid, block = tc.group_grid(m, tuple(counts[:len(weights)]))
    return steps + [Step(tc.TMA_GROUP, "gemm_tma", grid, block, gemm, shared, tc.options(tc.TMA_GROUP, cut=cut))]


def _grouped(a, pairs: list, swiglu: bool, add: bool) -> list:
    """The Hopper launches: the norm with its bf16 rows, the maps, the grouped or SwiGLU GEMM."""
    m, k = int(a.params["M"]), int(a.params["K"])
    layout = scratch_layout(m, k)
    if layout["total"] > int(a.scratch_bytes or 0):
        raise ScratchTooSmall(f"{a.scratch_bytes} bytes of scratch, the fused prefill row needs {layout['total']}")
    rows, maps = int(a.scratch or 0) + layout["rows"], int(a.scratch or 0) + layout["maps"]
    weights = [DeviceWeight(weight) for weight, _ in pairs]
    for weight in weights:
        if weight.codes % 16:
            raise ValueError(f"a weight at {weight.codes:#x} is not 16-byte aligned (TMA reads 16 bytes at a time)")
    return [_norm(a, add, rows)] + group_steps(rows, maps, [(weight.codes, weight.rows) for weight in weights],
                                               [y for _, y in pairs], m, k, swiglu)


def _chain(a, pairs: list, swiglu: bool, add: bool) -> list:
    """Anywhere else: the chain's own launches (the norm, each GEMM as the batch rows plan it, silu_mul)."""
    normed = a.t[3 if add else 2]
    steps = [_norm(a, add, 0)]
    for weight, y in pairs:
        steps += tc_gemm_steps(a, _address(normed), weight, y)
    if swiglu:
        (_, gate), (_, up) = pairs
        count = int(a.params["M"]) * DeviceWeight(pairs[0][0]).rows
        steps.append(silu_mul_step(gate, up, count, getattr(a.stream, "multiprocessors", 1)))
    return steps


def silu_mul_step(gate: int, up: int, count: int, multiprocessors: int) -> Step:
    """r4d_silu_mul_dev in place: gate = silu_mul(gate, up) over `count` f32 values."""
    return elementwise_step("r4d_silu_mul_dev", gate, up, gate, count, multiprocessors)


def _build(swiglu: bool, add: bool):
    def build(a):
        operands = a.t[4 if add else 3:]
        pairs = [(operands[i], _address(operands[i + 1])) for i in range(0, len(operands), 2)]
        return (_grouped if serves(a, swiglu) else _chain)(a, pairs, swiglu, add)
    return build


def stated_tolerances() -> dict:
    """{row name: its tolerance against libref}: the tensor-core GEMM's (x rounded to bf16), looser than
    gemm's own, and twice it for silu_mul's rows, whose gate multiplies two such sums (docs/OPS.md
    "Agreement with libref")."""
    gemm3, ffn = tc.TOLERANCE["bf16"], 2 * tc.TOLERANCE["bf16"]
    return {chained("r4d_add_rmsnorm_gemm3_tc_dev"): gemm3, chained("r4d_rmsnorm_gemm3_tc_dev"): gemm3,
            chained("r4d_add_rmsnorm_gemm2_silu_mul_tc_dev"): ffn, chained("r4d_rmsnorm_gemm2_silu_mul_tc_dev"): ffn}


def build_prefill_rows() -> list[RadKernelInfo]:
    constraints = [F32_ACTIVATIONS, RAD_CGE("M", FROM), RAD_CIN("wdtype", "bf16"), RAD_CDIV("K", 8)]
    stored = layout_as_stored(("bf16", "f32", "f16"))  # the GEMMs' bf16 weights and the norm's, as stored

    def row(name, op, swiglu, add, outputs, computes):
        return RadKernelInfo(name=chained(name), op=op, family="r4d", computes=f"{computes} (device/*.cu)",
                             shape=f"M>={FROM}, K%8==0", dtypes="f32 x bf16", domain=RAD_DOMAIN_DEVICE,
                             priority=PRIORITY, constraints=constraints, launch=_planned(name, _build(swiglu, add)),
                             layout=stored, scratch=_scratch(outputs), replaces=REPLACES[op])

    qkv = "the norm once, its rows narrowed to bf16 once, q, k and v in one TMA GEMM launch on Hopper"
    ffn = "the norm once, gate and up paired in one TMA GEMM launch with silu * mul in its epilogue on Hopper"
    return [
        row("r4d_add_rmsnorm_gemm3_tc_dev", "add_rmsnorm_gemm3", False, True, ("N.2", "N.3", "N.4"),
            "prefill: the residual add, " + qkv),
        row("r4d_add_rmsnorm_gemm2_silu_mul_tc_dev", "add_rmsnorm_gemm2_silu_mul", True, True, ("N.2", "N.3"),
            "prefill: the residual add, " + ffn),
        row("r4d_rmsnorm_gemm3_tc_dev", "rmsnorm_gemm3", False, False, ("N.1", "N.2", "N.3"), "prefill: " + qkv),
        row("r4d_rmsnorm_gemm2_silu_mul_tc_dev", "rmsnorm_gemm2_silu_mul", True, False, ("N.1", "N.2"),
            "prefill: " + ffn),
    ]
