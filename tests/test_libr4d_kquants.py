"""libr4d's rows for the GGUF block types (rows_kquants.py, r4d_kquants.c): q4_0, q5_0, q5_1 and the
k-quants q2_k..q6_k, imported from GGUF blocks as the converter imports them, against libref: the
decode GEMV and prefill GEMM rows within the int16 activations' tolerance of docs/LIBR4D.md (the f32
one at aq=0), the embedding bit for bit; on a rank's slice of columns; in the native, portable-C and numpy builds."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize

from radiance.abi import RAD_E_DTYPE, RAD_E_SHAPE, RAD_E_UNSUPPORTED, RadWeightPlanes, rad_tensor
from radiance.engine.loading.registry import Registry
from radiance.weights.gguf_blocks import gguf_encoding, split_blocks
from radiance.weights.slicing import slice_cols
from test_libr4d_gemm import r4d_row
from test_libr4d_support import (  # noqa: F401 (registry is a fixture)
    PREFILL_M, TOL_A16, TOL_F32, activations, launch, make_weight, registry, rel_err, row_of,
)

# Byte offsets of each block's f16 fields (random bytes elsewhere), as test_encoding_gguf's
F16_FIELDS = {Q.Q4_0: (0,), Q.Q5_0: (0,), Q.Q5_1: (0, 2), Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2),
              Q.Q5_K: (0, 2), Q.Q6_K: (208,)}
TYPES = tuple(F16_FIELDS)


def gguf_weight(qtype, rows, cols, seed):
    """(RadWeightPlanes as the converter imports it, gguf's own f32 values) of a [rows, cols]
    tensor of random blocks with small finite f16 fields."""
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, cols // block_size, type_size), np.uint8)
    for offset in F16_FIELDS[qtype]:
        field = rng.uniform(-0.02, 0.02, (rows, cols // block_size, 1)).astype(np.float16)
        data[..., offset:offset + 2] = field.view(np.uint8)
    data = data.reshape(rows, -1)
    return planes_of(qtype, split_blocks(data, qtype, (rows, cols)), (rows, cols)), \
        dequantize(data, qtype).reshape(rows, cols).astype(np.float32)


def planes_of(qtype, raw: dict, shape) -> RadWeightPlanes:
    encoding = gguf_encoding(qtype)
    return RadWeightPlanes(encoding=encoding, rows=shape[0], cols=shape[1],
                           planes=[rad_tensor(raw[plane.name]) for plane in encoding.planes])


def columns_for(qtype) -> int:
    return 512 if GGML_QUANT_SIZES[qtype][0] == 256 else 576


def gemm_both(reg, reference, qtype, weight, m, seed, **params):
    """(the libr4d row's name, its y, libref's y) for activations [m, cols]."""
    k, n = weight.cols, weight.rows
    x = activations(m, k, seed)
    geometry = {"M": m, "N": n, "K": k, "wdtype": qtype.name.lower(), "dtype": "f32", "split_k": 1, **params}
    out = []
    row = r4d_row(reg, m, geometry)
    for chosen in (row, row_of(reference, "gemm", "libref")):
        y = np.full((m, n), np.nan, np.float32)
        assert launch(chosen, [x, None, y], geometry, {1: weight}) == 0, chosen.name
        out.append(y)
    return row.name, out[0], out[1]


def tolerance(m):
    """Both bands at aq=16, the default: the decode GEMV's int16 activations, and the GEMM's where
    AMX serves it (f32 panels otherwise, held to the same bound)"""
    return TOL_A16


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("m", [1, 5, 16, 17, PREFILL_M])
def test_gemm_rows_agree_with_libref(registry, qtype, m):
    """Both bands, 98 output rows (a panel of 4 cut short at the end of each thread's share)."""
    weight, _ = gguf_weight(qtype, 98, columns_for(qtype), seed=int(qtype))
    name, y, ref = gemm_both(registry, registry, qtype, weight, m, seed=m)
    assert name == f"r4d_{'gemv' if m <= 16 else 'gemm'}_{qtype.name.lower()}"
    assert np.isfinite(y).all() and rel_err(y, ref) <= tolerance(m), (name, rel_err(y, ref))


@pytest.mark.parametrize("qtype", (Q.Q4_0, Q.Q5_0, Q.Q5_1), ids=lambda q: q.name)
@pytest.mark.parametrize("cols", [32, 608])
def test_the_decode_gemv_of_an_odd_block_count_agrees_with_libref(registry, qtype, cols):
    """The AVX-512 GEMV takes its blocks of 32 in pairs (KQ_TWO); one block, or 19, leave one alone."""
    weight, _ = gguf_weight(qtype, 50, cols, seed=cols)
    for m in (1, 5):
        name, y, ref = gemm_both(registry, registry, qtype, weight, m, seed=m)
        assert name == f"r4d_gemv_{qtype.name.lower()}"
        assert np.isfinite(y).all() and rel_err(y, ref) <= TOL_A16, (m, rel_err(y, ref))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [50, 98])
def test_a_sequence_decodes_to_the_same_bits_alone_or_in_a_batch(registry, qtype, rows):
    """The GEMV at M = 1 gives each output the bits it gives the same activation row at M = 2: a
    sequence's tokens do not depend on how many others decode with it, and a loop for M = 1 alone
    (tried: bench/results/host_avx512_2026-12-03d.md) must keep the products and their order. 50
    and 98 rows cut the threads' shares short; 608 columns leave a block of 32 alone."""
    for cols in {columns_for(qtype), 608 if GGML_QUANT_SIZES[qtype][0] == 32 else 1536}:
        weight, _ = gguf_weight(qtype, rows, cols, seed=rows + cols)
        x = activations(2, cols, seed=cols)
        outputs = []
        for m in (1, 2):
            geometry = {"M": m, "N": rows, "K": cols, "wdtype": qtype.name.lower(), "dtype": "f32", "split_k": 1}
            y = np.full((m, rows), np.nan, np.float32)
            assert launch(r4d_row(registry, m, geometry), [x[:m], None, y], geometry, {1: weight}) == 0
            outputs.append(y)
        assert np.isfinite(outputs[0]).all()
        assert np.array_equal(outputs[0][0], outputs[1][0]), (cols, np.abs(outputs[0][0] - outputs[1][0]).max())


def _cpu_has(flag):
    with open("/proc/cpuinfo") as f:
        return any(line.startswith("flags") and f" {flag}" in line for line in f)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("m", [1, 6])
def test_the_decode_gemv_at_aq_0_is_f32_and_at_aq_16_integer(registry, qtype, m):
    """aq=0: the weight decoded to f32 (f32's tolerance); aq=16: integer dot products on int16
    activations where the build has them (AVX-512 VBMI or AVX2; q2_k always decodes), so another result."""
    weight, _ = gguf_weight(qtype, 50, columns_for(qtype), seed=m)
    _, f32, ref = gemm_both(registry, registry, qtype, weight, m, seed=m + 1, aq=0)
    assert rel_err(f32, ref) <= TOL_F32, rel_err(f32, ref)
    _, a16, _ = gemm_both(registry, registry, qtype, weight, m, seed=m + 1, aq=16)
    assert rel_err(a16, ref) <= TOL_A16, rel_err(a16, ref)
    assert np.array_equal(a16, f32) == (qtype == Q.Q2_K or not _cpu_has("avx2"))


def _amx_granted():
    """libr4d's native build runs AMX tiles here (built for them, and the kernel granted their state)"""
    from plugins.kernels.libr4d import native
    try:
        return bool(native.load().isa & native.ISA_AMX)
    except native.NativeUnavailable:
        return False


# r4d_kquants.c's AMX formats: one scale per 32 (kq_amx_format, r4d_gemm_amx.h) and, with activations
# quantised per 256, q6_k's integer scales per 16 (r4d_gemm_amx256.h)
AMX_TYPES = (Q.Q4_0, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_the_prefill_gemm_at_aq_0_is_f32_and_at_aq_16_amx_where_it_serves(registry, qtype):
    """aq=0: f32 panels (f32's tolerance); aq=16: AMX int8 tiles on int16 activations where the build
    and kernel have them and the format is one of AMX_TYPES (the int16 tolerance), else the panels."""
    weight, _ = gguf_weight(qtype, 50, columns_for(qtype), seed=3)
    _, f32, ref = gemm_both(registry, registry, qtype, weight, PREFILL_M, seed=4, aq=0)
    assert rel_err(f32, ref) <= TOL_F32, rel_err(f32, ref)
    _, a16, _ = gemm_both(registry, registry, qtype, weight, PREFILL_M, seed=4, aq=16)
    assert rel_err(a16, ref) <= TOL_A16, rel_err(a16, ref)
    assert np.array_equal(a16, f32) == (qtype not in AMX_TYPES or not _amx_granted())


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_a_rank_s_slice_of_columns_agrees_with_libref(registry, qtype):
    """Tensor parallel cuts a row-parallel weight along K at a block edge; the slice's planes are
    read with their own row pitch."""
    block = GGML_QUANT_SIZES[qtype][0]
    weight, values = gguf_weight(qtype, 40, 4 * max(block, 64), seed=3)
    raw = {plane.name: tensor.data for plane, tensor in zip(weight.encoding.planes, weight.planes)}
    part, shape = slice_cols(weight.encoding, raw, (weight.rows, weight.cols), weight.cols // 2, weight.cols)
    sliced = planes_of(qtype, part, shape)
    name, y, ref = gemm_both(registry, registry, qtype, sliced, 3, seed=4)
    x = activations(3, shape[1], 4)
    assert rel_err(y, ref) <= TOL_A16, (name, rel_err(y, ref))
    exact = x.astype(np.float64) @ values[:, weight.cols // 2:].T.astype(np.float64)
    assert rel_err(y, exact) <= TOL_A16  # gguf's own values, not only libref's


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_embedding_is_exactly_gguf_s_values(registry, qtype):
    vocab, n = 300, columns_for(qtype)
    table, values = gguf_weight(qtype, vocab, n, seed=7)
    ids = np.array([0, vocab - 1, 5, 5, 123], np.int64)
    geometry = {"M": len(ids), "n": n, "vocab": vocab, "wdtype": qtype.name.lower(), "dtype": "f32"}
    outs = {}
    for library, name in (("libr4d", "r4d_embedding_gguf"), ("libref", None)):
        y = np.full((len(ids) + 1, n), 7.0, np.float32)
        assert launch(row_of(registry, "embedding", library, name), [ids, None, y], geometry, {1: table}) == 0
        outs[library] = y
    np.testing.assert_array_equal(outs["libr4d"].view(np.uint32), outs["libref"].view(np.uint32))
    np.testing.assert_array_equal(outs["libr4d"][:len(ids)], values[ids])
    assert (outs["libr4d"][len(ids):] == 7.0).all()
    y = np.zeros((1, n), np.float32)
    geometry["M"] = 1
    assert launch(row_of(registry, "embedding", "libr4d", "r4d_embedding_gguf"),
                  [np.array([vocab], np.int64), None, y], geometry, {1: table}) != 0  # outside the table


def test_layouts_refuse_what_the_rows_cannot_read(registry):
    gemv = row_of(registry, "gemm", "libr4d", "r4d_gemv_q4_k")
    q4_k, q6_k = gguf_encoding(Q.Q4_K), gguf_encoding(Q.Q6_K)
    assert gemv.info.layout("w", q4_k, {"K": 512}) == RAD_E_UNSUPPORTED  # read as stored
    assert gemv.info.layout("w", q4_k, {"K": 288}) == RAD_E_SHAPE  # not whole super-blocks
    assert gemv.info.layout("w", q6_k, {"K": 512}) == RAD_E_DTYPE
    assert gemv.info.layout("w", make_weight("q4_1", 4, 64, 0).encoding, {"K": 64}) == RAD_E_DTYPE
    embedding = row_of(registry, "embedding", "libr4d", "r4d_embedding_gguf")
    assert embedding.info.layout("w", q6_k, {"n": 512}) == RAD_E_UNSUPPORTED
    assert embedding.info.layout("w", make_weight("q8_0", 4, 64, 0).encoding, {"n": 64}) == RAD_E_DTYPE


@pytest.mark.parametrize("env", [{"RADIANCE_R4D_ISA": "portable"}, {"RADIANCE_R4D_NATIVE": "0"}],
                         ids=["portable-C", "numpy"])
def test_the_portable_and_numpy_builds_agree_with_libref(monkeypatch, tmp_path, env):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    reg = Registry(radiance_home="")
    try:
        backend = next(lib for lib in reg.hierarchy if lib.name == "libr4d").module.backend()
        assert backend.startswith("portable" if "RADIANCE_R4D_ISA" in env else "numpy"), backend
        for qtype in TYPES:
            weight, _ = gguf_weight(qtype, 20, columns_for(qtype), seed=9)
            for m in (1, PREFILL_M):
                name, y, ref = gemm_both(reg, reg, qtype, weight, m, seed=2)
                assert rel_err(y, ref) <= TOL_F32, (qtype.name, m, rel_err(y, ref))
    finally:
        reg.close()
