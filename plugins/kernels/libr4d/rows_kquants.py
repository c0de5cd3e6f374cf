"""libr4d's rows for the GGUF block types imported as bit-stream encodings: q4_0, q5_0, q5_1
(blocks of 32) and the k-quants q2_k, q3_k, q4_k, q5_k, q6_k (super-blocks of 256), whose kernels
are r4d_kquants.c. Each format has a decode GEMV row (M <= 16), a prefill GEMM row (M >= 17) and a
share of one embedding row; all read the planes as the container stores them.

The GEMV and the GEMM are one kernel: panels of 4 weight rows decoded to the core decoder's exact
f32 values, then f32 FMA dot products with every activation row (docs/LIBR4D.md). The two rows
exist so the selection can give each band its own kernel later without a change of names. Without
the native library they run the numpy bodies of fallback.py, as every libr4d row does.
"""

import weakref

import numpy as np

from radiance.abi import (
    RAD_DOMAIN_HOST, RAD_DT_F16, RAD_DT_I8, RAD_DT_U2, RAD_DT_U3, RAD_DT_U4, RAD_DT_U5, RAD_DT_U6, RAD_DT_U8,
    RAD_E_DTYPE, RAD_E_SHAPE, RAD_E_UNSUPPORTED, RAD_PLANE_TILED, RAD_CDIV, RAD_CEQ, RAD_CGE, RAD_CIN, RAD_CLE,
    RadKernelInfo, RadTensor, RadTunable,
)

from . import fallback
from .rows import (
    AQ_CHOICES, F32_ACTIVATIONS, GEMV_MAX_M, REPLACES, _bits, _guarded, _planned, aq_default, layout_vector, relayout_vector,
    unrelayout_vector,
)

BITS = {RAD_DT_U2: 2, RAD_DT_U3: 3, RAD_DT_U4: 4, RAD_DT_U5: 5, RAD_DT_U6: 6, RAD_DT_U8: 8, RAD_DT_I8: 8,
        RAD_DT_F16: 16}
WHOLE = (0, 0)  # a plane of one element for the whole weight (the zero)


def _kquant(codes, zero=None, scale=RAD_DT_U6, scale_cols=32, minimum=True):
    planes = {"codes": (codes, 1, 1), "scale": (scale, 1, scale_cols), "scale.1": (RAD_DT_F16, 1, 256)}
    if zero is not None:
        planes["zero"] = (RAD_DT_U8, *WHOLE)
    if minimum:
        planes.update({"min": (scale, 1, scale_cols), "min.1": (RAD_DT_F16, 1, 256)})
    return planes


# name: (r4d_kquants.c's format code, block of columns, zero or None, {plane: (dtype, block rows,
# block cols)}), as radiance.weights.formats defines them (scheme affine, no transform, vec 1)
FORMATS = {
    "q4_0": (1, 32, 8, {"codes": (RAD_DT_U4, 1, 1), "zero": (RAD_DT_U8, *WHOLE), "scale": (RAD_DT_F16, 1, 32)}),
    "q5_0": (2, 32, 16, {"codes": (RAD_DT_U5, 1, 1), "zero": (RAD_DT_U8, *WHOLE), "scale": (RAD_DT_F16, 1, 32)}),
    "q5_1": (3, 32, None, {"codes": (RAD_DT_U5, 1, 1), "scale": (RAD_DT_F16, 1, 32), "min": (RAD_DT_F16, 1, 32)}),
    "q2_k": (4, 256, None, _kquant(RAD_DT_U2, scale=RAD_DT_U4, scale_cols=16)),
    "q3_k": (5, 256, 4, _kquant(RAD_DT_U3, zero=4, scale=RAD_DT_I8, scale_cols=16, minimum=False)),
    "q4_k": (6, 256, None, _kquant(RAD_DT_U4)),
    "q5_k": (7, 256, None, _kquant(RAD_DT_U5)),
    "q6_k": (8, 256, 32, _kquant(RAD_DT_U6, zero=32, scale=RAD_DT_I8, scale_cols=16, minimum=False)),
}
LEVELS = ("codes", "scale", "scale.1", "min", "min.1")  # the pointers r4d_kquants.c takes, in order


def encoding_format(encoding) -> str | None:
    """The name in FORMATS `encoding` is exactly, else None."""
    if encoding is None or encoding.transform or encoding.vec != 1 or encoding.scheme != "affine":
        return None
    planes = {plane.name: plane for plane in encoding.planes}
    for name, (_, _, _, wanted) in FORMATS.items():
        if set(planes) == set(wanted) and all(
                planes[p].kind == RAD_PLANE_TILED and (planes[p].dtype, planes[p].block_rows, planes[p].block_cols)
                == spec for p, spec in wanted.items()):
            return name
    return None


def _layout(fmt):
    """Read as stored (RAD_E_UNSUPPORTED: the planes in place) when the weight is `fmt` and its
    columns are whole blocks; RAD_E_DTYPE / RAD_E_SHAPE otherwise."""
    def layout(weight, encoding, geometry):
        if encoding_format(encoding) != fmt:
            return RAD_E_DTYPE
        if int(geometry.get("K", geometry.get("n", 0))) % FORMATS[fmt][1]:
            return RAD_E_SHAPE
        return RAD_E_UNSUPPORTED
    return layout


def _layout_any(weight, encoding, geometry):
    fmt = encoding_format(encoding)
    return RAD_E_DTYPE if fmt is None else _layout(fmt)(weight, encoding, geometry)


class Prepared:
    """A weight as r4d_kquants.c takes it: format code, the five plane pointers (0 where the
    format has no such plane), rows, cols; `keep` holds the arrays the pointers point into."""
    __slots__ = ("ref", "fmt", "pointers", "rows", "cols", "keep", "__weakref__")


_WEIGHTS: dict = {}


def prepare(weight) -> Prepared:
    """Check a RadWeightPlanes once (format, every plane's byte count, the zero's value) and keep
    its plane pointers while it lives."""
    fmt = encoding_format(weight.encoding)
    if fmt is None:
        raise ValueError("libr4d: a weight in an encoding the GGUF block rows do not read")
    code, block, zero, wanted = FORMATS[fmt]
    rows, cols = int(weight.rows), int(weight.cols)
    if cols % block:
        raise ValueError(f"libr4d: a {fmt} weight of {cols} columns (not a multiple of {block})")
    arrays = {}
    for spec, tensor in zip(weight.encoding.planes, weight.planes):
        data = tensor.data if isinstance(tensor, RadTensor) else tensor
        arrays[spec.name] = np.ascontiguousarray(data).view(np.uint8)
    for name, (dtype, _, block_cols) in wanted.items():
        size = 1 if (name == "zero") else rows * (cols // block_cols) * BITS[dtype] // 8
        if arrays[name].nbytes != size:
            raise ValueError(f"libr4d: plane '{name}' of a {rows}x{cols} {fmt} weight holds "
                             f"{arrays[name].nbytes} bytes, not {size}")
    if zero is not None and int(arrays["zero"].reshape(-1)[0]) != zero:
        raise ValueError(f"libr4d: a {fmt} weight whose zero is {int(arrays['zero'].reshape(-1)[0])}, not {zero}")
    prepared = Prepared()
    key = id(weight)
    prepared.ref = weakref.ref(weight, lambda ref, key=key: _WEIGHTS.pop(key, None) if
                               getattr(_WEIGHTS.get(key), "ref", None) is ref else None)
    prepared.fmt, prepared.rows, prepared.cols, prepared.keep = code, rows, cols, arrays
    prepared.pointers = [arrays[name].ctypes.data if name in arrays else 0 for name in LEVELS]
    _WEIGHTS[key] = prepared
    return prepared


def weight_of(operand) -> Prepared:
    weight = operand.data if isinstance(operand, RadTensor) else operand
    entry = _WEIGHTS.get(id(weight))
    if entry is not None and entry.ref() is weight:
        return entry
    return prepare(weight)


def _pack_gemm(op, a):
    w = weight_of(a.t[1].data)
    op.keep.append(w)
    return [op(a.t[0].data), w.fmt, *w.pointers, op(a.t[2].data), a.params["M"], w.rows, w.cols]


def _pack_gemv(op, a, aq_fallback):
    aq = int(a.params.get("aq", aq_fallback))
    if aq not in AQ_CHOICES:
        raise ValueError(f"aq={aq}: not one of {AQ_CHOICES}")
    return [*_pack_gemm(op, a), aq]


def _pack_rmsnorm_gemm2(op, a, aq_fallback, width):
    """x, norm, normed, w1, y1, w2, y2 (rmsnorm_gemm2's wq, q, wk, k; rmsnorm_gemm2_silu_mul's wg,
    gate, wu, up): the packed arguments of r4d_kq_rmsnorm_gemm2_p and r4d_kq_rmsnorm_gemm2_silu_mul_p;
    `width` names the norm's width parameter (n, n.0)"""
    p = a.params
    aq = int(p.get("aq", aq_fallback))
    if aq not in AQ_CHOICES:
        raise ValueError(f"aq={aq}: not one of {AQ_CHOICES}")
    x, norm, normed, w1, y1, w2, y2 = (t.data for t in a.t)
    weights = []
    for operand, rows in ((w1, p["N.1"]), (w2, p["N.2"])):
        w = weight_of(operand)
        if (w.rows, w.cols) != (int(rows), int(p["K"])) or int(p[width]) != w.cols:
            raise ValueError(f"a {w.rows}x{w.cols} weight where N={rows}, K={p['K']}, n={p[width]}")
        op.keep.append(w)
        weights.append([w.fmt, *w.pointers, w.rows, w.cols])
    return [op(x), op(norm), op(normed), *weights[0], op(y1), *weights[1], op(y2), p["M"], _bits(p["eps"]), aq]


def _pack_gemv_add(op, a, aq_fallback):
    """x, w, y, residual: r4d_kq_gemv_add_p's packed arguments"""
    p = a.params
    aq = int(p.get("aq", aq_fallback))
    if aq not in AQ_CHOICES:
        raise ValueError(f"aq={aq}: not one of {AQ_CHOICES}")
    x, weight, y, residual = (t.data for t in a.t)
    w = weight_of(weight)
    if (w.rows, w.cols) != (int(p["N"]), int(p["K"])) or int(p["n"]) != w.rows:
        raise ValueError(f"a {w.rows}x{w.cols} weight where N={p['N']}, K={p['K']}, n={p['n']}")
    op.keep.append(w)
    return [op(x), w.fmt, *w.pointers, w.rows, w.cols, op(y), op(residual), p["M"], aq]


def _layout_fused(fmt):
    """The fused row's weights: the norm's decoded to an f32 vector (as r4d_rmsnorm reads it), the
    projections' read as stored (`fmt`, whole blocks)."""
    projection = _layout(fmt)

    def layout(weight, encoding, geometry):
        if encoding_format(encoding) is not None:
            return projection(weight, encoding, geometry)
        return layout_vector(weight, encoding, geometry)
    return layout


def _pack_embedding(op, a):
    w = weight_of(a.t[1].data)
    op.keep.append(w)
    return [op(a.t[0].data), w.fmt, *w.pointers, w.rows, w.cols, op(a.t[2].data), a.params["M"]]


def build_rows(native) -> list[RadKernelInfo]:
    """The GEMV, GEMM and embedding rows of FORMATS, bound to r4d_kquants.c, or to numpy when
    `native` is None."""
    aq = 0 if aq_default() == 0 else 16
    if native is not None:
        gemv = _planned(native, "r4d_kq_gemv_p", lambda op, a: _pack_gemv(op, a, aq))
        gemm = _planned(native, "r4d_kq_gemm_p", lambda op, a: _pack_gemv(op, a, aq))
        embedding = _planned(native, "r4d_kq_embedding_p", _pack_embedding)
        fused = _planned(native, "r4d_kq_rmsnorm_gemm2_silu_mul_p", lambda op, a: _pack_rmsnorm_gemm2(op, a, aq, "n.0"))
        fused_qk = _planned(native, "r4d_kq_rmsnorm_gemm2_p", lambda op, a: _pack_rmsnorm_gemm2(op, a, aq, "n"))
        gemv_add = _planned(native, "r4d_kq_gemv_add_p", lambda op, a: _pack_gemv_add(op, a, aq))
        body = "r4d_kquants.c"
    else:
        gemm, embedding = _guarded("gemm (numpy)", fallback.gemm), _guarded("embedding (numpy)", fallback.embedding)
        gemv, fused, fused_qk, gemv_add = gemm, None, None, None
        body = "numpy fallback"

    def row(name, op, launch, constraints, computes, shape, dtypes, layout, tunables=(), **hooks):
        return RadKernelInfo(name=name, op=op, family="r4d", computes=f"{computes} ({body})", shape=shape,
                             dtypes=dtypes, domain=RAD_DOMAIN_HOST, priority=10, constraints=constraints,
                             launch=launch, layout=layout, tunables=list(tunables), **hooks)

    tunable = [RadTunable(name="aq", values="0,16", deflt=aq)]

    found = []
    for fmt, (_, block, _, _) in FORMATS.items():
        common = [RAD_CIN("wdtype", fmt), F32_ACTIVATIONS, RAD_CEQ("split_k", 1), RAD_CDIV("K", block)]
        found.append(row(f"r4d_gemv_{fmt}", "gemm", gemv, [RAD_CLE("M", GEMV_MAX_M), *common],
                         "decode GEMV: codes unpacked to int16, integer dot products with the int16 activations "
                         "(aq=16; AVX-512 VBMI, not q2_k), else panels decoded to f32 (aq=0)",
                         f"M<={GEMV_MAX_M}, K%{block}==0", f"f32 x {fmt}", _layout(fmt), tunable))
        found.append(row(f"r4d_gemm_{fmt}", "gemm", gemm, [RAD_CGE("M", GEMV_MAX_M + 1), *common],
                         "prefill GEMM: AMX int8 tiles against the int16 activations (aq=16; an AMX build, "
                         "one scale per 32: q4_0, q5_0, q5_1, q4_k, q5_k; q6_k with activations quantised per 256), "
                         "else 24 weight rows decoded exactly "
                         "per panel, reused by every row of x (aq=0)",
                         f"M>={GEMV_MAX_M + 1}, K%{block}==0", f"f32 x {fmt}", _layout(fmt), tunable))
        # At TP 1 the decode step's o and down projections take the residual adds (gemm_add), so the norms
        # after them are free for rmsnorm_gemm2 (the attention's, with q and k) and rmsnorm_gemm2_silu_mul
        # (the FFN's): a layer's 12 launches become 7 (selection takes the first fusion in graph order, and
        # add_rmsnorm would otherwise take each norm)
        if native is not None:  # without it the chain runs as declared
            found.append(row(f"r4d_rmsnorm_gemm2_{fmt}", "rmsnorm_gemm2", fused_qk,
                             [RAD_CLE("M", GEMV_MAX_M), *common[:2], RAD_CDIV("K", block)],
                             "the attention's norm, q and k in one launch: r4d_rmsnorm, then the decode GEMV over "
                             "the rows of both weights in one parallel region (the activations quantised once); "
                             "the chain's bits", f"M<={GEMV_MAX_M}, K%{block}==0", f"f32 x {fmt}", _layout_fused(fmt),
                             tunable, relayout=relayout_vector, unrelayout=unrelayout_vector, replaces=REPLACES["rmsnorm_gemm2"]))
            found.append(row(f"r4d_rmsnorm_gemm2_silu_mul_{fmt}", "rmsnorm_gemm2_silu_mul", fused,
                             [RAD_CLE("M", GEMV_MAX_M), *common[:2], RAD_CDIV("K", block)],
                             "the FFN's norm, gate and up, silu * up in one launch: r4d_rmsnorm, then the decode "
                             "GEMV over the rows of both weights in one parallel region (the activations "
                             "quantised once), then r4d_silu_mul; the chain's bits",
                             f"M<={GEMV_MAX_M}, K%{block}==0", f"f32 x {fmt}", _layout_fused(fmt), tunable,
                             relayout=relayout_vector, unrelayout=unrelayout_vector,
                             replaces=REPLACES["rmsnorm_gemm2_silu_mul"]))
            found.append(row(f"r4d_gemm_add_{fmt}", "gemm_add", gemv_add,
                             [RAD_CLE("M", GEMV_MAX_M), *common[:2], RAD_CDIV("K", block)],
                             "the decode GEMV, then r4d_add's residual add, in one launch; the chain's bits",
                             f"M<={GEMV_MAX_M}, K%{block}==0", f"f32 x {fmt}", _layout(fmt), tunable,
                             replaces=REPLACES["gemm_add"]))
    formats = " ".join(FORMATS)
    found.append(row("r4d_embedding_gguf", "embedding", embedding, [RAD_CIN("wdtype", formats), F32_ACTIVATIONS],
                     "table rows decoded to f32 exactly", "n a whole number of blocks", f"{formats} table",
                     _layout_any))
    return found
