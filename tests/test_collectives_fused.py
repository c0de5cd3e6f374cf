"""The fused row all_reduce_add_rmsnorm_host equals the chain it replaces, all_reduce (rank order) then
libref's add then libref's rmsnorm, bit for bit, on one rank and between real rank processes."""

import numpy as np
import pytest

from radiance.abi import RAD_LINK_ENDED, RAD_OK, RadArgs, rad_tensor
from radiance.plugins.kernels.libref import dense as libref
from test_collectives_harness import load_kernel, rank_order_sum, run_ranks

EPS = 1e-5
SHAPES = [(1, 7), (3, 576), (5, 1001), (32, 2048)]


def partial(case, rank, m, n):
    rng = np.random.default_rng([case, rank, 1])
    return (rng.standard_normal((m, n)) * 10.0 ** rng.uniform(-2, 2, (m, n))).astype(np.float32)


def residual_and_weight(case, m, n):
    rng = np.random.default_rng([case, 99])
    return rng.standard_normal((m, n)).astype(np.float32), (1 + rng.standard_normal(n) / 4).astype(np.float32)


def reference_chain(case, world, m, n):
    """all_reduce in rank order, then libref add (residual = residual + x), then libref rmsnorm."""
    x = rank_order_sum([partial(case, r, m, n) for r in range(world)])
    residual, w = residual_and_weight(case, m, n)
    params = {"M": m, "n": n, "dtype": "f32"}
    assert libref.add(RadArgs(t=(rad_tensor(residual), rad_tensor(x), rad_tensor(residual)), params=params)) == RAD_OK
    y = np.empty((m, n), np.float32)
    assert libref.rmsnorm(RadArgs(t=(rad_tensor(residual), rad_tensor(w), rad_tensor(y)),
                                  params={**params, "eps": EPS})) == RAD_OK
    return x, residual, y


def fused(kernel, case, rank, world, m, n, peers=None, gate=None, limit=None):
    x = partial(case, rank, m, n)
    residual, w = residual_and_weight(case, m, n)
    y = np.full((m, n), np.nan, np.float32)
    params = {"M": m, "n": n, "eps": EPS, "dtype": "f32"}
    if limit is not None:
        params["one_shot_max_bytes"] = limit
    status = kernel.all_reduce_add_rmsnorm_host(
        RadArgs(t=(rad_tensor(x), rad_tensor(residual), rad_tensor(w), rad_tensor(y)), params=params, peers=peers,
                link_gate=gate))
    return status, x, residual, y


def bits(array):
    return np.ascontiguousarray(array).view(np.uint32)


def test_the_fused_schema_and_replaces():
    kernel = load_kernel()
    schema = kernel.FUSED_SCHEMA
    assert schema.op == "all_reduce_add_rmsnorm"
    assert kernel.FUSED_REPLACES == "all_reduce(x)+add(residual,x,residual)+rmsnorm(residual,w,y)"
    assert [(p.name, p.type, p.req, p.role) for p in schema.params] == [
        ("M", 1, 0, 1), ("n", 1, 0, 0), ("eps", 2, 0, 0), ("dtype", 3, 0, 0)]
    assert [(o.name, o.role, o.fixed) for o in schema.operands] == [
        ("x", 3, 0), ("residual", 3, 0), ("w", 4, 1), ("y", 2, 0)]
    (row,) = [info for info, _ in kernel.HOST_ROWS if info.op == schema.op]
    assert row.replaces == kernel.FUSED_REPLACES and row.launch is kernel.all_reduce_add_rmsnorm_host


@pytest.mark.parametrize("m, n", SHAPES)
def test_fused_equals_the_chain_on_one_rank(m, n):
    kernel = load_kernel()
    status, x, residual, y = fused(kernel, 0, 0, 1, m, n)
    ref_x, ref_residual, ref_y = reference_chain(0, 1, m, n)
    assert status == RAD_OK
    assert np.array_equal(bits(x), bits(ref_x)) and np.array_equal(bits(residual), bits(ref_residual))
    assert np.array_equal(bits(y), bits(ref_y))


def _fused_rank(rank):
    kernel = load_kernel()
    owner, peers = rank.peers(buffer_bytes=1 << 20)
    out = []
    for case, (m, n) in enumerate(SHAPES):
        for limit in (None, 0):  # the row's choice, and reduce-scatter forced
            gate = np.ones(1, np.uint64)
            status, x, residual, y = fused(kernel, case, rank.rank, rank.world, m, n, peers, gate, limit)
            ref_x, ref_residual, ref_y = reference_chain(case, rank.world, m, n)
            pairs = ((x, ref_x), (residual, ref_residual), (y, ref_y))
            same = [bool(np.array_equal(bits(a), bits(b))) for a, b in pairs]
            out.append(((m, n, limit), status, int(gate[0]), *same))
    rank.sync()
    owner.close()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_fused_equals_the_chain_between_ranks(world):
    for rank, out in enumerate(run_ranks(_fused_rank, world)):
        for case, status, gate, same_x, same_residual, same_y in out:
            assert (status, gate) == (RAD_LINK_ENDED, 0), f"rank {rank}, {case}"
            assert same_x and same_residual and same_y, f"rank {rank}, {case}: x, residual, y same: " \
                                                        f"{same_x}, {same_residual}, {same_y}"
