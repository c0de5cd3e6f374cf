"""libr4d's rows: the constraints each one declares, its hooks, and its launch.

Launches are thin: each reads its operands off `RadArgs` and makes one ctypes call into r4d.c,
handing over the addresses of the numpy array objects (native.py) and the plane pointers of the
weight, prepared once per weight object. Without the native library every row runs its numpy body
(fallback.py) instead; the constraints are the same.
"""

import ctypes
import logging
import os
import weakref

import numpy as np

from radiance.abi import (
    RAD_C_EQ, RAD_DOMAIN_HOST, RAD_DT_BF16, RAD_DT_F16, RAD_DT_F32, RAD_DT_I8, RAD_DT_U4, RAD_E_DTYPE,
    RAD_E_INVALID, RAD_E_NOMEM, RAD_E_SHAPE, RAD_E_UNSUPPORTED, RAD_OK, RAD_PLANE_TILED, RAD_CDIV, RAD_CEQ,
    RAD_CGE, RAD_CIN, RAD_CLE, RadKernelInfo, RadTensor, RadTunable, rad_weight_f32, rad_weight_from_f32,
)

from . import fallback
from . import sample as sampling

F32 = np.float32
log = logging.getLogger("radiance.libr4d")

# The GEMV rows serve M <= GEMV_MAX_M: the weight streams once per 4 activation rows, with int16
# activations by default. Measured here (docs/LIBR4D.md) they beat the f32 GEMM rows at every M up
# to 32 on every SmolLM2 shape; the edge sits at 16 so decode batches of up to 16 sequences take the
# GEMV and prefill chunks keep the GEMM's f32 accuracy.
GEMV_MAX_M = 16

# How the decode GEMV rows carry activations (tunable `aq`, docs/LIBR4D.md): 16 = int16 per block of
# 32 (the default: within 3e-5 of f32, most of int8's speed), 8 = int8 (llama.cpp's q8_1: fastest,
# about 1% off), 0 = f32. RADIANCE_R4D_AQ overrides the default.
AQ_CHOICES = (0, 8, 16)
# The q8_0 prefill GEMM's (tunable `aq`, docs/LIBR4D.md): 16 = the GEMV's int16 activations and
# integer products (the default: AMX int8 tiles where built and granted, AVX2 register tiles on AVX2
# builds; an AVX-512 build without AMX, and a portable one, run the f32 panels either way), 0 = f32
# panels. RADIANCE_R4D_AQ=0 makes 0 the default here too.
GEMM_AQ_CHOICES = (0, 16)


def aq_default() -> int:
    """RADIANCE_R4D_AQ, read when the plugin opens; 16 when unset or not one of 0, 8, 16."""
    text = os.environ.get("RADIANCE_R4D_AQ", "16").strip()
    return int(text) if text in ("0", "8", "16") else 16

# format codes of r4d.c
FORMAT_CODES = {"f32": 0, "f16": 1, "bf16": 2, "q8_0": 3, "q4_1": 4}
PLAIN = {RAD_DT_F32: "f32", RAD_DT_F16: "f16", RAD_DT_BF16: "bf16"}
QK = 32

# ------------------------------------------------------------------------------------------------
# encodings

def _tiled(plane, dtype, block_rows, block_cols) -> bool:
    return (plane is not None and plane.kind == RAD_PLANE_TILED and plane.dtype == dtype
            and plane.block_rows == block_rows and plane.block_cols == block_cols)


def encoding_format(encoding) -> str | None:
    """The format name when `encoding` is exactly one r4d.c reads as stored, else None:
    q4_1 (u4 codes, f16 scale and min per 32), q8_0 (i8 codes, f16 scale per 32), plain f32/f16/bf16."""
    if encoding is None or encoding.transform or encoding.vec != 1:
        return None
    planes = {plane.name: plane for plane in encoding.planes}
    codes = planes.get("codes")
    if encoding.scheme == "plain" and set(planes) == {"codes"} and codes is not None and codes.dtype in PLAIN:
        return PLAIN[codes.dtype] if _tiled(codes, codes.dtype, 1, 1) else None
    if (encoding.scheme == "plain" and set(planes) == {"codes", "scale"} and _tiled(codes, RAD_DT_I8, 1, 1)
            and _tiled(planes["scale"], RAD_DT_F16, 1, QK)):
        return "q8_0"
    if (encoding.scheme == "affine" and set(planes) == {"codes", "scale", "min"} and _tiled(codes, RAD_DT_U4, 1, 1)
            and _tiled(planes["scale"], RAD_DT_F16, 1, QK) and _tiled(planes["min"], RAD_DT_F16, 1, QK)):
        return "q4_1"
    return None


def _layout_as_stored(formats):
    """A layout hook: read the planes as the container holds them (RAD_E_UNSUPPORTED: no copy, so a
    weight mapped from the file is read in place and a tied table is shared) when the encoding is
    one of `formats`; RAD_E_DTYPE otherwise."""
    def layout(weight, encoding, geometry):
        found = encoding_format(encoding)
        if found not in formats:
            return RAD_E_DTYPE
        if found in ("q4_1", "q8_0") and int(geometry.get("K", geometry.get("n", QK))) % QK:
            return RAD_E_SHAPE
        return RAD_E_UNSUPPORTED
    return layout


class Prepared:
    """What a launch needs of a weight: r4d.c's format code, the plane pointers, rows, cols."""
    __slots__ = ("ref", "fmt", "codes", "scale", "min", "rows", "cols", "keep", "__weakref__")


_WEIGHTS: dict = {}


def _forget(key, ref):
    entry = _WEIGHTS.get(key)
    if entry is not None and entry.ref is ref:
        del _WEIGHTS[key]


def prepare(weight) -> Prepared:
    """Check a RadWeightPlanes once and keep its plane pointers while it lives."""
    fmt = encoding_format(weight.encoding)
    if fmt is None:
        raise ValueError("libr4d: a weight in an encoding this library does not read")
    rows, cols = int(weight.rows), int(weight.cols)
    arrays = {}
    for spec, tensor in zip(weight.encoding.planes, weight.planes):
        data = tensor.data if isinstance(tensor, RadTensor) else tensor
        arrays[spec.name] = np.ascontiguousarray(data)
    element = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 1}.get(fmt)
    code_bytes = rows * cols * element if element else rows * ((cols + 1) // 2)
    wanted = {"codes": code_bytes}
    if fmt in ("q4_1", "q8_0"):
        if cols % QK:
            raise ValueError(f"libr4d: a {fmt} weight of {cols} columns (not a multiple of {QK})")
        wanted["scale"] = rows * (cols // QK) * 2
    if fmt == "q4_1":
        wanted["min"] = rows * (cols // QK) * 2
    for name, size in wanted.items():
        if arrays[name].nbytes != size:
            raise ValueError(f"libr4d: plane '{name}' of a {rows}x{cols} {fmt} weight holds "
                             f"{arrays[name].nbytes} bytes, not {size}")
    prepared = Prepared()
    key = id(weight)
    prepared.ref = weakref.ref(weight, lambda ref, key=key: _forget(key, ref))
    prepared.fmt, prepared.rows, prepared.cols = FORMAT_CODES[fmt], rows, cols
    prepared.codes = arrays["codes"].ctypes.data
    prepared.scale = arrays["scale"].ctypes.data if "scale" in wanted else None
    prepared.min = arrays["min"].ctypes.data if "min" in wanted else None
    prepared.keep = arrays
    _WEIGHTS[key] = prepared
    return prepared


def weight_of(operand) -> Prepared:
    weight = operand.data if isinstance(operand, RadTensor) else operand
    entry = _WEIGHTS.get(id(weight))
    if entry is not None and entry.ref() is weight:
        return entry
    return prepare(weight)


def relayout_vector(weight, geometry):
    """rmsnorm's weight: decoded to a contiguous f32 vector once at load."""
    return np.ascontiguousarray(rad_weight_f32(weight), dtype=F32).reshape(-1)


def unrelayout_vector(stored, geometry):
    """The inverse, for rad-kbench: the f32 vector as the plain f32 encoding's planes."""
    return rad_weight_from_f32(stored)


def layout_vector(weight, encoding, geometry):
    return RAD_OK if encoding is not None and encoding.scheme in ("plain", "affine") else RAD_E_DTYPE


# ------------------------------------------------------------------------------------------------
# native launches
#
# The engine builds a RadArgs once per (node, tokens, sequences) and launches it every step. So a
# launch is planned once per RadArgs: its arguments packed into one int64 array that r4d.c's *_p
# entry points unpack (operands as array heads copied side by side into the plan, plane pointers,
# extents, doubles by their bits). Each node's objects are touched once per token, after ~96 MB of
# weights have streamed through the caches, so a launch that reads few, adjacent lines is a faster
# launch. The plan rides on the RadArgs itself and is used again while the operand tuple, parameter
# dict, scratch and M are the same objects and value; anything else plans anew. It keeps its
# operands alive, so their data never moves under it.

PLAN_ATTRIBUTE = "_r4d_plan"


class Plan:
    __slots__ = ("owner", "t", "params", "scratch", "m", "call", "arg", "keep")


_PLANS: dict = {}  # where a RadArgs takes no attribute: id -> (weakref, plan)


def _planned(native, name, pack):
    """A launch for `pack(operand, a) -> values`, calling r4d.c's `name` in `native`. Planning
    errors (an operand of the wrong kind or shape) are logged and returned as RAD_E_INVALID; r4d.c
    returns its own codes for what it refuses."""
    def launch(a):
        try:
            plan = a.__dict__.get(PLAN_ATTRIBUTE)
        except AttributeError:
            plan = _stored_plan(a)
        if (plan is None or plan.owner is not launch or plan.t is not a.t or plan.params is not a.params
                or plan.scratch is not a.scratch or plan.m != a.params["M"]):
            try:
                plan = _plan(native, a, name, pack, launch)
            except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as error:
                log.error("libr4d: %s: %s: %s", name, type(error).__name__, error)
                return RAD_E_INVALID
        return plan.call(plan.arg)
    launch.__name__ = name
    return launch


def _stored_plan(a):
    entry = _PLANS.get(id(a))
    return entry[1] if entry is not None and entry[0]() is a else None


class _Operands:
    """Hands out the array heads of one plan, side by side in one block."""

    def __init__(self, native, count):
        self.block = (native.Header * count)()
        self.used, self.keep = 0, []

    def __call__(self, array):
        if not isinstance(array, np.ndarray):
            raise TypeError(f"an operand is {type(array).__name__}, not a numpy array")
        header = self.block[self.used]
        header.fill(array)
        self.used += 1
        self.keep.append(array)
        return ctypes.addressof(header)


def _plan(native, a, name, pack, owner) -> Plan:
    operands = _Operands(native, len(a.t) + 1)
    values = pack(operands, a)
    packed = np.array([int(v) for v in values], dtype=np.int64)
    plan = Plan()
    plan.owner, plan.t, plan.params, plan.scratch, plan.m = owner, a.t, a.params, a.scratch, a.params["M"]
    plan.call = getattr(native.lib, name)
    plan.arg = ctypes.c_void_p(packed.ctypes.data)
    plan.keep = (packed, operands, tuple(t.data for t in a.t))
    try:
        setattr(a, PLAN_ATTRIBUTE, plan)
    except AttributeError:  # a RadArgs without a __dict__
        _PLANS[id(a)] = (weakref.ref(a, lambda ref, key=id(a): _PLANS.pop(key, None)), plan)
    return plan


def _data(a, i):
    return a.t[i].data


def _bits(value: float) -> int:
    return int(np.float64(value).view(np.int64))


def _weight_values(w: Prepared):
    return [w.fmt, w.codes, w.scale or 0, w.min or 0]


def _pack_gemv(op, a, aq_fallback=16):
    p = a.params
    w = weight_of(a.t[1].data)
    m, aq = int(p["M"]), int(p.get("aq", aq_fallback))
    if aq not in AQ_CHOICES:
        raise ValueError(f"aq={aq}: not one of {AQ_CHOICES}")
    op.keep.append(w)
    return [op(_data(a, 0)), *_weight_values(w), op(_data(a, 2)), m, w.rows, w.cols, aq]


def _pack_gemm(op, a, aq_fallback=16):
    w = weight_of(a.t[1].data)
    aq = int(a.params.get("aq", aq_fallback)) if w.fmt == FORMAT_CODES["q8_0"] else 0
    if aq not in GEMM_AQ_CHOICES:
        raise ValueError(f"aq={aq}: not one of {GEMM_AQ_CHOICES}")
    op.keep.append(w)
    return [op(_data(a, 0)), *_weight_values(w), op(_data(a, 2)), a.params["M"], w.rows, w.cols, aq]


def _pack_embedding(op, a):
    w = weight_of(a.t[1].data)
    op.keep.append(w)
    return [op(_data(a, 0)), *_weight_values(w), w.rows, w.cols, op(_data(a, 2)), a.params["M"]]


def _pack_rmsnorm(op, a):
    p = a.params
    return [op(_data(a, 0)), op(_data(a, 1)), op(_data(a, 2)), p["M"], p["n"], _bits(p["eps"])]


def _pack_rows3(op, a):
    p = a.params
    return [op(_data(a, 0)), op(_data(a, 1)), op(_data(a, 2)), p["M"], p["n"]]


def _pack_rope(op, a):
    p = a.params
    return [*(op(_data(a, i)) for i in range(4)), p["M"], p["q_heads"], p["kv_heads"], p["head_dim"],
            p["interleaved"]]


KV_CACHE_TYPES = (np.dtype(np.float32), np.dtype(np.float16))  # the caches r4d.c's attention reads


def _pack_attention(op, a):
    p = a.params
    caches = {_data(a, 3).dtype, _data(a, 4).dtype}
    if len(caches) != 1 or caches.pop() not in KV_CACHE_TYPES:
        raise TypeError(f"k_cache, v_cache are {_data(a, 3).dtype}, {_data(a, 4).dtype}: not both f32 or both f16")
    return [*(op(_data(a, i)) for i in range(11)), p["M"], p["q_heads"], p["kv_heads"], p["head_dim"],
            p["block_size"], _bits(p["scale"])]


def _pack_add_rmsnorm(op, a):
    p = a.params
    return [*(op(_data(a, i)) for i in range(4)), p["M"], p["n"], _bits(p["eps"])]


def add_rmsnorm(native):
    """`fn(residual, x, w, y, m, n, eps) -> status`: residual += x, y = rmsnorm(residual) * w, bit
    for bit libref's add then rmsnorm (w: f32 [n]). For the fused all_reduce + add + rmsnorm once its
    reduction is done; None without the native library. The array heads are kept per set of arrays
    (a node passes the same ones every step)."""
    if native is None:
        return None
    function = native.lib.r4d_add_rmsnorm_p
    known: dict = {}

    def call(residual, x, w, y, m, n, eps):
        # one packed argument per (operands, extents), as the rows' launch plans: the call converts nothing
        key = (id(residual), id(x), id(w), id(y), m, n, eps)
        entry = known.get(key)
        if entry is None or entry[1][0] is not residual or entry[1][1] is not x or entry[1][3] is not y:
            if len(known) > 4096:
                known.clear()
            operands = _Operands(native, 4)
            packed = np.array([*(operands(array) for array in (residual, x, w, y)), int(m), int(n), _bits(eps)],
                              dtype=np.int64)
            entry = known[key] = (ctypes.c_void_p(packed.ctypes.data), (residual, x, w, y), operands, packed)
        return function(entry[0])
    return call


NATIVE_ENTRIES = {"gemv": ("r4d_gemv_p", _pack_gemv), "gemm": ("r4d_gemm_p", _pack_gemm),
                  "embedding": ("r4d_embedding_p", _pack_embedding), "rmsnorm": ("r4d_rmsnorm_p", _pack_rmsnorm),
                  "add": ("r4d_add_p", _pack_rows3), "silu_mul": ("r4d_silu_mul_p", _pack_rows3),
                  "take_rows": ("r4d_take_rows_p", _pack_rows3), "rope": ("r4d_rope_p", _pack_rope),
                  "attention": ("r4d_attention_p", _pack_attention),
                  "add_rmsnorm": ("r4d_add_rmsnorm_p", _pack_add_rmsnorm)}
FALLBACK_LAUNCH = {"gemv": fallback.gemm, "gemm": fallback.gemm, "embedding": fallback.embedding,
                   "rmsnorm": fallback.rmsnorm, "add": fallback.add, "silu_mul": fallback.silu_mul,
                   "take_rows": fallback.take_rows, "rope": fallback.rope, "attention": fallback.attention,
                   "add_rmsnorm": fallback.add_rmsnorm}


def _guarded(name, launch):
    """A launch whose operands r4d.c refuses returns its error code; one that raises (an operand
    of the wrong kind) logs what was raised and returns RAD_E_INVALID rather than unwinding
    through the engine."""
    def guarded(a):
        try:
            return launch(a)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, ctypes.ArgumentError) as error:
            log.error("libr4d: row %s: %s: %s", name, type(error).__name__, error)
            return RAD_E_INVALID
    guarded.__name__ = name
    return guarded


# ------------------------------------------------------------------------------------------------
# the table

F32_ACTIVATIONS = RAD_CEQ("dtype", "f32")
# the chains libr4d's fused rows replace (host and device alike), spelled with the fused ops'
# operands (docs/OPS.md)
REPLACES = {
    "add_rmsnorm": "add(residual,x,residual)+rmsnorm(residual,w,y)",
    "rmsnorm_gemm3": "rmsnorm(x,norm,normed)+gemm(normed,wq,q)+gemm(normed,wk,k)+gemm(normed,wv,v)",
    "rmsnorm_gemm2": "rmsnorm(x,norm,normed)+gemm(normed,wq,q)+gemm(normed,wk,k)",
    "rmsnorm_gemm2_silu_mul": "rmsnorm(x,norm,normed)+gemm(normed,wg,gate)+gemm(normed,wu,up)+silu_mul(gate,up,gate)",
    "add_rmsnorm_gemm3": "add(residual,x,residual)+rmsnorm(residual,norm,normed)"
                         "+gemm(normed,wq,q)+gemm(normed,wk,k)+gemm(normed,wv,v)",
    "add_rmsnorm_gemm2_silu_mul": "add(residual,x,residual)+rmsnorm(residual,norm,normed)"
                                  "+gemm(normed,wg,gate)+gemm(normed,wu,up)+silu_mul(gate,up,gate)",
    "gemm_add": "gemm(x,w,y)+add(residual,y,residual)",
    "rope_attention": "rope(q,k,positions,inv_freq)+attention(q,k,v,k_cache,v_cache,slots,positions,cu_seqlens,"
                      "context_lens,block_tables,out)",
    "take_rows_rmsnorm_gemm_sample": "take_rows(h,index,rows)+rmsnorm(rows,norm,normed)+gemm(normed,w,logits)"
                                     "+sample(logits,temperature,top_k,top_p,rng,tokens)",
}


def build_rows(native) -> list[RadKernelInfo]:
    """The rows, their launches bound to the native library, or to numpy when it is None."""
    aq = aq_default()
    if native is not None:
        gemm_aq = 0 if aq == 0 else 16
        entries = {**NATIVE_ENTRIES, "gemv": ("r4d_gemv_p", lambda op, a: _pack_gemv(op, a, aq)),
                   "gemm": ("r4d_gemm_p", lambda op, a: _pack_gemm(op, a, gemm_aq))}
        table = {kind: _planned(native, name, pack) for kind, (name, pack) in entries.items()}
    else:
        table = {kind: _guarded(f"{kind} (numpy)", launch) for kind, launch in FALLBACK_LAUNCH.items()}
    body = "r4d.c" if native is not None else "numpy fallback"

    def row(name, op, kind, constraints, computes, shape, dtypes, **hooks):
        return RadKernelInfo(name=name, op=op, family="r4d", computes=f"{computes} ({body})", shape=shape,
                             dtypes=dtypes, domain=RAD_DOMAIN_HOST, priority=10, constraints=constraints,
                             launch=table[kind], **hooks)

    tunable = [RadTunable(name="aq", values="0,8,16", deflt=aq)]
    gemm_tunable = [RadTunable(name="aq", values="0,16", deflt=0 if aq == 0 else 16)]
    gemm_rows = []
    for fmt, label in (("q4_1", "q4_1"), ("q8_0", "q8_0"), ("f32 f16 bf16", "plain")):
        quantised = label != "plain"
        common = [RAD_CIN("wdtype", fmt), F32_ACTIVATIONS, RAD_CEQ("split_k", 1)]
        if quantised:
            common.append(RAD_CDIV("K", QK))
        layout = _layout_as_stored(fmt.split())
        gemm_rows.append(row(
            f"r4d_gemv_{label}", "gemm", "gemv", [RAD_CLE("M", GEMV_MAX_M), *common],
            "decode GEMV: weight streamed once per 4 rows; activations int16 (aq=16), int8 (aq=8) or f32 (aq=0)"
            if quantised else "decode GEMV, f32 accumulation",
            f"M<={GEMV_MAX_M}" + (", K%32==0" if quantised else ""), f"f32 x {fmt}",
            layout=layout, tunables=tunable if quantised else []))
        gemm_rows.append(row(
            f"r4d_gemm_{label}", "gemm", "gemm", [RAD_CGE("M", GEMV_MAX_M + 1), *common],
            "prefill GEMM: int16 activations and products, AMX int8 tiles or 4x2 register tiles (aq=16, AMX "
            "or AVX2), or 24-row weight panels dequantised to f32, 4x3 FMA register tiles (aq=0)" if label == "q8_0" else
            "prefill GEMM: 24-row weight panels dequantised to f32, 4x3 FMA register tiles",
            f"M>={GEMV_MAX_M + 1}" + (", K%32==0" if quantised else ""), f"f32 x {fmt}", layout=layout,
            tunables=gemm_tunable if label == "q8_0" else []))
    formats = "q8_0 q4_1 f32 f16 bf16"
    return [
        row("r4d_embedding", "embedding", "embedding", [RAD_CIN("wdtype", formats), F32_ACTIVATIONS],
            "table rows decoded to f32", "any", f"{formats} table", layout=_layout_as_stored(formats.split())),
        row("r4d_rmsnorm", "rmsnorm", "rmsnorm", [F32_ACTIVATIONS], "libref's ordered sum of squares",
            "any", "f32", layout=layout_vector, relayout=relayout_vector, unrelayout=unrelayout_vector),
        *gemm_rows,
        row("r4d_rope", "rope", "rope", [F32_ACTIVATIONS, RAD_CDIV("head_dim", 2), RAD_CLE("head_dim", 1024)],
            "cos/sin in f64 rounded to f32, tabled per position", "head_dim<=1024, even", "f32"),
        row("r4d_attention", "attention", "attention", [F32_ACTIVATIONS],
            "paged KV (f32 or f16 cache); FMA dot products, f64 exp, ordered softmax sums", "any", "f32"),
        row("r4d_add", "add", "add", [F32_ACTIVATIONS], "elementwise", "any", "f32"),
        row("r4d_silu_mul", "silu_mul", "silu_mul", [F32_ACTIVATIONS], "sigmoid in f64 rounded to f32",
            "any", "f32"),
        row("r4d_take_rows", "take_rows", "take_rows", [F32_ACTIVATIONS], "row gather", "any", "f32"),
        # where no all_reduce stands between the residual add and the next norm (TP 1: the worker
        # elides the collectives of one rank), the two in one launch, bit for bit the chain
        row("r4d_add_rmsnorm", "add_rmsnorm", "add_rmsnorm", [F32_ACTIVATIONS],
            "add's elementwise sum, then rmsnorm's ordered sum of squares", "any", "f32", layout=layout_vector,
            relayout=relayout_vector, unrelayout=unrelayout_vector, replaces=REPLACES["add_rmsnorm"]),
        RadKernelInfo(name="r4d_sample", op="sample", family="r4d",
                      computes="libref's tokens: greedy, top-k by partition, top-p over the ordered head",
                      shape="any", dtypes="f32 logits", domain=RAD_DOMAIN_HOST, priority=10, constraints=[],
                      launch=_guarded("r4d_sample", sampling.sampler(native))),
    ]
