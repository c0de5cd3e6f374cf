"""libref's ordered dot product (plugins/kernels/libref/ordered.py), which the blocks of w's rows it
transposes leave bit for bit the reference contract: each product rounded to f32, added in k order."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

spec = importlib.util.spec_from_file_location(
    "libref_ordered", Path(__file__).resolve().parent.parent / "plugins" / "kernels" / "libref" / "ordered.py")
ordered = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ordered)


def column_at_a_time(x, w):
    """The contract written plainly: for each k in order, total += f32(x[:, k] * w[:, k])."""
    total = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for k in range(x.shape[1]):
        total = (total + (x[:, k, None] * w[None, :, k]).astype(np.float32)).astype(np.float32)
    return total


@pytest.mark.parametrize("m,n,k", [(1, 7, 5), (3, ordered.DOT_BLOCK + 3, 50), (2, 2 * ordered.DOT_BLOCK, 4), (40, 64, 300)])
def test_ordered_dot_is_the_column_at_a_time_sum_bit_for_bit(m, n, k):
    rng = np.random.default_rng(m * n + k)
    # magnitudes from 1e-3 to 1e3: an order of addition other than k's shows in the last bits
    x = (rng.standard_normal((m, k)) * 10.0 ** rng.integers(-3, 4, (m, k))).astype(np.float32)
    w = (rng.standard_normal((n, k)) * 10.0 ** rng.integers(-3, 4, (n, k))).astype(np.float32)
    np.testing.assert_array_equal(ordered.ordered_dot(x, w), column_at_a_time(x, w))


def test_the_sum_runs_in_k_order_not_pairwise():
    """1 + 2^-24 + 2^-24 in order stays 1 in f32; summed pairwise, the two halves would make 1 + 2^-23."""
    x = np.ones((1, 3), np.float32)
    w = np.array([[1.0, 2.0 ** -24, 2.0 ** -24]], np.float32)
    assert ordered.ordered_dot(x, w)[0, 0] == np.float32(1.0)
    assert ordered.ordered_dot(x, w[:, ::-1])[0, 0] == np.float32(1.0 + 2.0 ** -23)


def ordered_dot_before(x, w, block=2048):
    """ordered_dot as it was before libref kept its weights column-major (86e2b4c): every call
    transposed w by blocks of rows and made one product and one add per k."""
    x = np.asarray(x, dtype=np.float32)
    w = np.asarray(w, dtype=np.float32)
    total = np.zeros((x.shape[0], w.shape[0]), dtype=np.float32)
    for start in range(0, w.shape[0], block):
        columns = np.ascontiguousarray(w[start:start + block].T)
        part = total[:, start:start + block]
        product = np.empty_like(part)
        for k in range(x.shape[1]):
            np.multiply(x[:, k, None], columns[None, k, :], out=product)
            part += product
    return total


def awkward(rng, shape):
    """Values from 1e-40 (subnormal) to 1e30, and zeros of both signs, infinities and NaNs among them:
    a rounding, an order or a sign of zero other than the old form's shows."""
    values = rng.standard_normal(shape) * 10.0 ** rng.integers(-40, 31, shape)
    special = rng.random(shape)
    values[special < 0.02] = -0.0
    values[(special >= 0.02) & (special < 0.03)] = 0.0
    values[(special >= 0.03) & (special < 0.032)] = np.inf
    values[(special >= 0.032) & (special < 0.034)] = -np.inf
    values[(special >= 0.034) & (special < 0.035)] = np.nan
    return values.astype(np.float32)


@pytest.mark.parametrize("m,n,k", [(1, 7, 5), (1, 1, 300), (2, 1, 9), (1, 576, 576), (6, 1536, 576), (3, 577, 1537),
                                   (1, ordered.DOT_BLOCK + 5, 70), (5, 2 * ordered.DOT_BLOCK + 1, 3), (4, 9, 0),
                                   (0, 9, 4), (70, 1000, 2)])
@pytest.mark.parametrize("layout", ["row-major", "column-major"])
def test_ordered_dot_is_its_old_form_bit_for_bit(m, n, k, layout):
    """Whatever the weight's layout (libref's relayout keeps column-major the weights its rows
    multiply by), and across the chunks of products (ordered.PRODUCT_CHUNK) and the blocks of rows."""
    rng = np.random.default_rng(m * 7919 + n * 31 + k)
    x, w = awkward(rng, (m, k)), awkward(rng, (n, k))
    stored = np.asfortranarray(w) if layout == "column-major" else w
    with np.errstate(all="ignore"):  # inf * 0 and inf - inf make NaNs, in both forms
        got, want = ordered.ordered_dot(x, stored), ordered_dot_before(x, w)
    assert got.dtype == np.float32 and got.shape == (m, n)
    assert got.tobytes() == want.tobytes()  # bits, NaNs and zeros' signs included


def test_an_all_negative_zero_sum_is_a_positive_zero_as_before():
    """0 + (-0) + (-0) ... starts from +0: the sum of -0 products is +0, in both layouts."""
    x = np.full((1, 4), -1.0, np.float32)
    w = np.zeros((3, 4), np.float32)
    for stored in (w, np.asfortranarray(w)):
        got = ordered.ordered_dot(x, stored)
        assert got.tobytes() == ordered_dot_before(x, w).tobytes() == np.zeros((1, 3), np.float32).tobytes()


@pytest.mark.parametrize("fmt,n,k", [("q4_1", 192, 576), ("q8_0", 2 * ordered.DOT_BLOCK + 40, 64), ("f32", 300, 33)])
def test_libref_gemm_keeps_its_weight_column_major_with_the_decoded_values(fmt, n, k):
    """The gemm row's relayout: the decoded f32 values, stored column-major (blocks of
    dense.TRANSPOSE_ROWS rows copied at a time); its unrelayout gives the same values back; and the
    row's output is the old ordered_dot's over the row-major decode, bit for bit."""
    from radiance.abi import rad_weight_f32
    from radiance.engine.loading.registry import Registry
    from test_libr4d_support import activations, launch, make_weight, row_of

    registry = Registry(radiance_home="")
    try:
        row = row_of(registry, "gemm", "libref")
        weight = make_weight(fmt, n, k, seed=n + k)
        geometry = {"M": 3, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
        stored = row.info.relayout(weight, dict(geometry))
        decoded = rad_weight_f32(weight)
        assert stored.shape == (n, k) and stored.flags.f_contiguous and not stored.flags.c_contiguous
        assert stored.tobytes(order="C") == np.ascontiguousarray(decoded, np.float32).tobytes()
        back = rad_weight_f32(row.info.unrelayout(stored, dict(geometry)))
        assert back.tobytes() == np.ascontiguousarray(decoded, np.float32).tobytes()
        x = activations(3, k, seed=k)
        y = np.zeros((3, n), np.float32)
        assert launch(row, [x, None, y], geometry, {1: weight}) == 0
        assert y.tobytes() == ordered_dot_before(x, decoded).tobytes()
    finally:
        registry.close()
