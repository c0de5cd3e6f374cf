"""libref: the oracle. One reference row for every op of docs/OPS.md, under the reference
contract (f32 accumulation, round-to-nearest-even, no FMA, sums in index order). It ranks last and
serves only with --debug-accept-reference-kernels; a kernel checker is to hold other
libraries against it."""

from radiance.abi import (
    RAD_ABI_VERSION, RAD_C_EQ, RAD_DOMAIN_HOST, RAD_OK, RAD_PLUGIN_KERNEL, RadConstraint, RadKernelInfo,
    RadPluginInfo, SIZED_OPS, vocabulary_opd_shape,
)

from . import attention, collective, dense, fused, sample
from .vocabulary import SCHEMAS

F32_ONLY = RadConstraint("dtype", RAD_C_EQ, 0, "f32")


def _layout(weight, encoding, geometry):
    return RAD_OK  # every weight decoded to f32 by relayout


def _row(name, op, launch, computes, weights=False, constraints=(F32_ONLY,), replaces=""):
    # a row that multiplies keeps its weights column-major, as ordered_dot walks them (a norm's vector
    # is the same either way)
    relayout = dense.relayout_columns if op == "gemm" or "gemm(" in replaces else dense.relayout_f32
    hooks = dict(layout=_layout, relayout=relayout, unrelayout=dense.unrelayout_f32) if weights else {}
    if op in SIZED_OPS:
        hooks["opd_shape"] = vocabulary_opd_shape(op)  # so rad-kbench can call it cold
    return RadKernelInfo(name=f"ref_{name}", op=op, family="reference", computes=computes, shape="any",
                         dtypes="f32 activations", domain=RAD_DOMAIN_HOST, priority=0,
                         constraints=list(constraints), launch=launch, replaces=replaces, **hooks)


ROWS = [
    _row("embedding", "embedding", dense.embedding, "table rows, decoded to f32", weights=True),
    _row("rmsnorm", "rmsnorm", dense.rmsnorm, "ordered sum of squares", weights=True),
    _row("gemm", "gemm", dense.gemm, "ordered dot products over K", weights=True),
    _row("rope", "rope", attention.rope, "cos/sin in f64 rounded to f32"),
    _row("attention", "attention", attention.attention, "ordered sums over head_dim and keys"),
    _row("sliding_attention", "sliding_attention", attention.sliding_attention,
         "attention's ordered sums, positions outside the window masked"),
    _row("rmsnorm_heads", "rmsnorm_heads", dense.rmsnorm_heads, "ordered sum of squares per head", weights=True),
    _row("scale", "scale", dense.scale, "elementwise, the scale rounded to f32"),
    _row("gelu_tanh_mul", "gelu_tanh_mul", dense.gelu_tanh_mul, "tanh GELU in f64 rounded to f32"),
    _row("add", "add", dense.add, "elementwise"),
    _row("silu_mul", "silu_mul", dense.silu_mul, "sigmoid in f64 rounded to f32"),
    _row("take_rows", "take_rows", dense.take_rows, "row gather"),
    _row("all_reduce", "all_reduce", collective.all_reduce, "one rank"),
    _row("all_gather", "all_gather", collective.all_gather, "one rank"),
    _row("sample", "sample", sample.sample, "greedy, top-k, top-p, Philox draw", constraints=()),
    *(_row(op, op, fused.chain_row(op), "the chain it replaces, libref's rows in order", weights=True,
           replaces=text)
      for op, text in fused.REPLACES.items()),
]


def rad_plugin_abi_version():
    return RAD_ABI_VERSION


def rad_plugin_info():
    return RadPluginInfo(RAD_PLUGIN_KERNEL, "libref", "0.1", "the reference oracle for every op", "host")


def rad_plugin_reference():
    return 1


def rad_kernel_schema_count():
    return len(SCHEMAS)


def rad_kernel_schema_at(i):
    return SCHEMAS[i]


def rad_kernel_count():
    return len(ROWS)


def rad_kernel_at(i):
    return ROWS[i]


def rad_kernel_collective(i):
    return 1 if ROWS[i].op in ("all_reduce", "all_gather", "all_reduce_add_rmsnorm") else 0
