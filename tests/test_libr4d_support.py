"""libr4d test support (imported by the other test_libr4d_* files) and the plugin-level tests:
it loads as a plugin, covers every op but the collectives, declares honest constraints and layouts.

Rows are called as the engine calls them: through the registry's Row objects, weights handed over
as the row's layout hook asks (RAD_E_UNSUPPORTED: the RadWeightPlanes as stored; RAD_OK: what its
relayout returned), RadArgs built by hand with numpy operands and the scratch its hook sizes.
Tolerances are those of docs/LIBR4D.md; `rel_err` is max|y - ref| / max|ref| over the output."""

import numpy as np
import pytest

from radiance.abi import (
    RAD_DOMAIN_HOST, RAD_DT_ENCODED, RAD_DT_NONE, RAD_E_DTYPE, RAD_E_UNSUPPORTED, RAD_OK, RadArgs, RadTensor,
    RadWeightPlanes, rad_tensor,
)
from radiance.engine.loading.registry import Registry
from radiance.weights import formats
from radiance.weights.planes import plane_raw

# SmolLM2-135M
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 576, 9, 3, 64, 1536, 49152
# (name, N, K) of every linear weight of a layer and the tied lm head
LINEAR = [("q", HEADS * HEAD_DIM, HIDDEN), ("k", KV_HEADS * HEAD_DIM, HIDDEN), ("v", KV_HEADS * HEAD_DIM, HIDDEN),
          ("o", HIDDEN, HEADS * HEAD_DIM), ("gate", FFN, HIDDEN), ("up", FFN, HIDDEN), ("down", HIDDEN, FFN)]
PREFILL_M = 37

# docs/LIBR4D.md: max|y - ref| / max|ref|
TOL_F32 = 5e-6       # f32 activations: FMA and another summation order than libref's (measured <= 1.4e-6)
TOL_A16 = 2e-4       # int16 activations per block of 32, the decode GEMV's default aq=16 (measured <= 9e-5)
TOL_A8 = 5e-2        # int8 activations per block of 32, aq=8, llama.cpp's q8_1 (measured <= 2.1e-2)
TOLERANCE = {0: TOL_F32, 16: TOL_A16, 8: TOL_A8}


@pytest.fixture(scope="session")
def registry():
    reg = Registry(radiance_home="")
    yield reg
    reg.close()


def row_of(registry, op, library, name=None):
    rows = [row for row in registry.rows_for(op) if row.plugin.name == library and (name is None or row.name == name)]
    assert rows, f"{library} has no row {name or ''} for {op}"
    return rows[0]


def rel_err(y, ref) -> float:
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(y - ref).max() / max(np.abs(ref).max(), 1e-30))


# ---------------------------------------------------------------------------------------------
# weights

def weight_planes(encoding, typed: dict, shape) -> RadWeightPlanes:
    """A RadWeightPlanes of raw plane bytes from typed plane values."""
    tensors = [rad_tensor(plane_raw(plane, typed[plane.name], shape)) for plane in encoding.planes]
    return RadWeightPlanes(encoding=encoding, rows=shape[0], cols=shape[1], planes=tensors)


def quantize_q4_1(w: np.ndarray) -> RadWeightPlanes:
    """GGUF-style Q4_1 of f32 rows: per 32 columns m = min, d = (max - m) / 15, code = round((w - m) / d)."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32)
    low, high = g.min(axis=2), g.max(axis=2)
    scale = ((high - low) / 15).astype(np.float16)
    minimum = low.astype(np.float16)
    inverse = np.where(scale > 0, 1 / np.maximum(scale.astype(np.float32), 1e-30), 0)
    codes = np.clip(np.rint((g - minimum[..., None].astype(np.float32)) * inverse[..., None]), 0, 15)
    return weight_planes(formats.q4_1(), {"codes": codes.reshape(rows, cols).astype(np.uint8), "scale": scale,
                                          "min": -minimum}, (rows, cols))


def quantize_q8_0(w: np.ndarray) -> RadWeightPlanes:
    rows, cols = w.shape
    g = w.reshape(rows, cols // 32, 32)
    scale = (np.abs(g).max(axis=2) / 127).astype(np.float16)
    inverse = np.where(scale > 0, 1 / np.maximum(scale.astype(np.float32), 1e-30), 0)
    codes = np.clip(np.rint(g * inverse[..., None]), -127, 127).astype(np.int8)
    return weight_planes(formats.q8_0(), {"codes": codes.reshape(rows, cols), "scale": scale}, (rows, cols))


def plain_weight(w: np.ndarray, dtype: str) -> RadWeightPlanes:
    import ml_dtypes
    kinds = {"f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
    return weight_planes(formats.plain(dtype), {"codes": w.astype(kinds[dtype])}, w.shape)


def make_weight(fmt: str, rows: int, cols: int, seed: int) -> RadWeightPlanes:
    w = (np.random.default_rng(seed).standard_normal((rows, cols)) * 0.02).astype(np.float32)
    if fmt == "q4_1":
        return quantize_q4_1(w)
    if fmt == "q8_0":
        return quantize_q8_0(w)
    return plain_weight(w, fmt)


def activations(m: int, k: int, seed: int) -> np.ndarray:
    """Activations like a normed residual stream: unit normal with a few outlier channels."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, rng.choice(k, 4, replace=False)] *= 8
    return x


# ---------------------------------------------------------------------------------------------
# calling rows as the engine does

def weight_operand(row, name: str, weight: RadWeightPlanes, geometry: dict) -> RadTensor:
    code = row.info.layout(name, weight.encoding, dict(geometry)) if row.info.layout else None
    assert code in (None, RAD_OK, RAD_E_UNSUPPORTED), f"{row.name}: layout answered {code}"
    if code == RAD_OK:
        return RadTensor(data=row.info.relayout(weight, dict(geometry)), dtype=RAD_DT_NONE, ndim=2,
                         shape=(weight.rows, weight.cols, 0, 0))
    return RadTensor(data=weight, dtype=RAD_DT_ENCODED, ndim=2, shape=(weight.rows, weight.cols, 0, 0))


def launch(row, operands: list, params: dict, weights: dict | None = None) -> int:
    """Launch `row` on `operands` (numpy arrays, or the index of a weight in `weights`), with the
    scratch its hook asks for at this geometry; returns the status."""
    tensors = []
    for i, operand in enumerate(operands):
        if weights and i in weights:
            tensors.append(weight_operand(row, f"w{i}", weights[i], params))
        else:
            tensors.append(rad_tensor(operand))
    scratch = np.zeros(int(row.info.scratch(dict(params))), np.uint8) if row.info.scratch else None
    args = RadArgs(t=tuple(tensors), params=dict(params), scratch=scratch,
                   scratch_bytes=0 if scratch is None else scratch.size)
    return row.info.launch(args)


# ---------------------------------------------------------------------------------------------
# plugin-level tests

OPS = ("embedding", "rmsnorm", "gemm", "rope", "attention", "add", "silu_mul", "take_rows", "sample",
       "scale", "rmsnorm_heads", "gelu_tanh_mul", "sliding_attention")  # the last four: Gemma 3's


def test_libr4d_loads_as_a_plugin_and_serves_every_op(registry):
    assert not registry.refused
    library = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    assert not library.reference
    compute = {row.op for row in library.rows if not row.collective and not row.info.replaces}
    host = {row.op for row in library.rows if not row.collective and not row.info.replaces
            and row.info.domain == RAD_DOMAIN_HOST}
    # Gemma 3's four ops have host rows (rows_gemma.py) and device rows (device_gemma_rows.py)
    assert host == set(OPS) and compute == set(OPS)
    fused = {row.op for row in library.rows if row.info.replaces and not row.collective}
    assert fused == {"add_rmsnorm", "rmsnorm_gemm3", "rmsnorm_gemm2", "rmsnorm_gemm2_silu_mul", "gemm_add",
                     "rope_attention", "take_rows_rmsnorm_gemm_sample", "add_rmsnorm_gemm3",
                     "add_rmsnorm_gemm2_silu_mul"}  # the device rows' and the host's
    # the collectives are collectives.py's rows, listed by the export table with their colours
    collective = {row.name: (row.op, row.collective, row.chain) for row in library.rows if row.collective}
    assert {op for op, _, _ in collective.values()} <= {"all_reduce", "all_gather", "all_reduce_add_rmsnorm",
                                                        "send", "recv"}  # send/recv: pipeline.py's stage rows
    assert all(chain == ("r4dchain" in name) for name, (_, _, chain) in collective.items())
    module = library.module
    assert "numpy fallback" not in module.backend(), module.backend()


def test_gemm_rows_split_m_into_a_decode_and_a_prefill_band(registry):
    from radiance.engine.selection.bands import resolve
    gemm_rows = [row for row in registry.rows_for("gemm")]
    schema = registry.ops["gemm"].schema
    for wdtype, label in (("q4_1", "q4_1"), ("q8_0", "q8_0"), ("bf16", "plain")):
        geometry = {"N": 576, "K": 576, "wdtype": wdtype, "dtype": "f32"}
        resolution = resolve("gemm", schema, gemm_rows, geometry, {}, 1, 256)
        names = [(band.lo, band.hi, band.row.name) for band in resolution.bands]
        limit = registry_gemv_max(registry)
        assert names == [(1, limit, f"r4d_gemv_{label}"), (limit + 1, 256, f"r4d_gemm_{label}")]
        assert all(band.geometry["split_k"] == 1 for band in resolution.bands)


def registry_gemv_max(registry) -> int:
    return next(lib for lib in registry.hierarchy if lib.name == "libr4d").module.rows.GEMV_MAX_M


def test_layout_hooks_read_their_formats_as_stored_and_refuse_others(registry):
    q41, q80 = formats.q4_1(), formats.q8_0()
    geometry = {"M": 1, "N": 64, "K": 64, "dtype": "f32"}
    gemv = row_of(registry, "gemm", "libr4d", "r4d_gemv_q4_1")
    assert gemv.info.layout("w", q41, {**geometry, "wdtype": "q4_1"}) == RAD_E_UNSUPPORTED
    assert gemv.info.layout("w", q80, {**geometry, "wdtype": "q8_0"}) == RAD_E_DTYPE
    assert gemv.info.layout("w", formats.q4_1(group=64), {**geometry, "wdtype": "q4_1"}) == RAD_E_DTYPE
    assert gemv.info.layout("w", formats.q4_0(), {**geometry, "wdtype": "q4_0"}) == RAD_E_DTYPE
    plain = row_of(registry, "gemm", "libr4d", "r4d_gemv_plain")
    for dtype in ("f32", "f16", "bf16"):
        assert plain.info.layout("w", formats.plain(dtype), {**geometry, "wdtype": dtype}) == RAD_E_UNSUPPORTED
    assert plain.info.layout("w", formats.plain("i8"), {**geometry, "wdtype": "i8"}) == RAD_E_DTYPE
    embedding = row_of(registry, "embedding", "libr4d")
    for encoding in (q41, q80, formats.plain("bf16")):
        assert embedding.info.layout("t", encoding, {"M": 1, "n": 64, "vocab": 10}) == RAD_E_UNSUPPORTED
    assert embedding.info.layout("t", formats.nvfp4(), {"M": 1, "n": 64, "vocab": 10}) == RAD_E_DTYPE


def test_a_wrong_operand_is_an_error_code_not_a_crash(registry):
    row = row_of(registry, "add", "libr4d")
    a, b = np.ones((2, 8), np.float32), np.ones((2, 8), np.float32)
    wrong = np.ones((2, 7), np.float32)
    assert launch(row, [a, b, wrong], {"M": 2, "n": 8, "dtype": "f32"}) != RAD_OK
    short = np.ones((1, 8), np.float32)
    assert launch(row, [a, short, np.ones((2, 8), np.float32)], {"M": 2, "n": 8, "dtype": "f32"}) != RAD_OK


def test_libr4d_fused_rows_replace_exactly_the_chains_libref_declares(registry):
    """The chain text lives in each plugin (neither imports the other): held equal here."""
    chains = {}
    for library in registry.hierarchy:
        for row in library.rows:
            if row.info.replaces:
                chains.setdefault(row.op, set()).add(row.info.replaces)
    assert all(len(texts) == 1 for texts in chains.values()), chains
