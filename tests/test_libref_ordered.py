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
