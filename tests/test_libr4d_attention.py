"""libr4d's rope and attention rows against libref's, at SmolLM2-135M's heads (9 query heads, 3 kv
heads, head_dim 64): rope both pairings; attention over a paged cache (block_size 16, blocks
scattered) with several sequences mixing prefill chunks and decode tokens in one step."""

import numpy as np
import pytest

from test_libr4d_support import (  # noqa: F401 (registry is a fixture)
    HEAD_DIM, HEADS, KV_HEADS, PREFILL_M, launch, registry, rel_err, row_of,
)

TOL_ATTENTION = 1e-5  # docs/LIBR4D.md: FMA dot products of q and k (measured <= 2.4e-6)
# docs/OPS.md: an f16 cache against an f32 one, both libref's: k and v rounded to 11 bits
TOL_F16_CACHE = 2e-3


def inv_freq(theta=100000.0, head_dim=HEAD_DIM):
    return (1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)).astype(np.float32)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("m", [1, PREFILL_M])
def test_rope_is_exactly_libref_s(registry, interleaved, m):
    rng = np.random.default_rng(m + interleaved)
    q0 = rng.standard_normal((m, HEADS * HEAD_DIM)).astype(np.float32)
    k0 = rng.standard_normal((m, KV_HEADS * HEAD_DIM)).astype(np.float32)
    positions = rng.integers(0, 8192, m).astype(np.int32)
    positions[0] = 0
    params = {"M": m, "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "interleaved": interleaved,
              "dtype": "f32"}
    out = {}
    for library in ("libr4d", "libref"):
        for repeat in range(2):  # the second launch reads libr4d's table of angles
            q, k = q0.copy(), k0.copy()
            assert launch(row_of(registry, "rope", library), [q, k, positions, inv_freq()], params) == 0
            out[library, repeat] = (q, k)
    for repeat in range(2):
        np.testing.assert_array_equal(out["libr4d", repeat][0], out["libref", 0][0])
        np.testing.assert_array_equal(out["libr4d", repeat][1], out["libref", 0][1])


def test_rope_follows_a_new_inv_freq_table(registry):
    """libr4d keeps cos/sin per position, keyed by the inv_freq values: another table is another key."""
    m = 4
    rng = np.random.default_rng(9)
    q0 = rng.standard_normal((m, HEADS * HEAD_DIM)).astype(np.float32)
    k0 = rng.standard_normal((m, KV_HEADS * HEAD_DIM)).astype(np.float32)
    positions = np.array([3, 4, 5, 6], np.int32)
    params = {"M": m, "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "interleaved": 0, "dtype": "f32"}
    for theta in (10000.0, 500000.0, 10000.0):
        results = []
        for library in ("libr4d", "libref"):
            q, k = q0.copy(), k0.copy()
            assert launch(row_of(registry, "rope", library), [q, k, positions, inv_freq(theta)], params) == 0
            results.append((q, k))
        np.testing.assert_array_equal(results[0][0], results[1][0])
        np.testing.assert_array_equal(results[0][1], results[1][1])


def paged_step(seqs, block_size=16, num_blocks=96, seed=0):
    """Operands of one attention step: `seqs` is [(cached positions before the step, new tokens)];
    each sequence's blocks scattered over the cache, whose other slots hold noise."""
    rng = np.random.default_rng(seed)
    blocks_per_seq = max(-(-(start + n) // block_size) for start, n in seqs) + 1
    order = rng.permutation(num_blocks)
    tables = np.full((len(seqs) + 1, blocks_per_seq), -1, np.int32)  # one spare row: a longer buffer
    slots, positions, cu, ctx = [], [], [0], []
    for s, (start, n) in enumerate(seqs):
        tables[s] = order[s * blocks_per_seq:(s + 1) * blocks_per_seq]
        for p in range(start, start + n):
            positions.append(p)
            slots.append(tables[s, p // block_size] * block_size + p % block_size)
        cu.append(cu[-1] + n)
        ctx.append(start + n)
    m = cu[-1]
    width = KV_HEADS * HEAD_DIM
    return dict(
        q=rng.standard_normal((m, HEADS * HEAD_DIM)).astype(np.float32) * 2,
        k=rng.standard_normal((m, width)).astype(np.float32), v=rng.standard_normal((m, width)).astype(np.float32),
        k_cache=rng.standard_normal((num_blocks * block_size, width)).astype(np.float32),
        v_cache=rng.standard_normal((num_blocks * block_size, width)).astype(np.float32),
        slots=np.array(slots, np.int32), positions=np.array(positions, np.int32), cu=np.array(cu, np.int32),
        ctx=np.array(ctx, np.int32), tables=tables, m=m, block_size=block_size)


def run_attention(registry, library, step, cache=np.float32):
    """`cache`: the KV cache's type (the engine's --kv-cache-dtype), the step's noise rounded to it."""
    k_cache, v_cache = step["k_cache"].astype(cache), step["v_cache"].astype(cache)
    out = np.full((step["m"] + 3, HEADS * HEAD_DIM), 5.0, np.float32)
    operands = [step["q"], step["k"], step["v"], k_cache, v_cache, step["slots"], step["positions"], step["cu"],
                step["ctx"], step["tables"][:len(step["ctx"])], out]
    params = {"M": step["m"], "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
              "block_size": step["block_size"], "scale": HEAD_DIM ** -0.5, "dtype": "f32"}
    assert launch(row_of(registry, "attention", library), operands, params) == 0
    return out, k_cache, v_cache


CASES = {
    "prefill and decode": [(0, 20), (40, 1), (33, 7), (0, 1)],  # a prompt, a decode, a later chunk, a 1-token prompt
    "decode batch": [(5, 1), (130, 1), (16, 1), (15, 1)],
    "long prefill chunk": [(100, PREFILL_M)],
    "block edges": [(15, 2), (31, 1), (47, 17)],
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_attention_over_a_paged_cache(registry, case):
    step = paged_step(CASES[case], seed=len(case))
    ours, k_ours, v_ours = run_attention(registry, "libr4d", step)
    ref, k_ref, v_ref = run_attention(registry, "libref", step)
    np.testing.assert_array_equal(k_ours, k_ref)  # the step's k, v stored at their slots, nothing else
    np.testing.assert_array_equal(v_ours, v_ref)
    m = step["m"]
    assert rel_err(ours[:m], ref[:m]) <= TOL_ATTENTION, rel_err(ours[:m], ref[:m])
    assert (ours[m:] == 5.0).all()  # rows past the step untouched


def test_attention_with_long_contexts(registry):
    step = paged_step([(1000, 1), (700, 3)], num_blocks=160, seed=3)
    ours, _, _ = run_attention(registry, "libr4d", step)
    ref, _, _ = run_attention(registry, "libref", step)
    assert rel_err(ours[:step["m"]], ref[:step["m"]]) <= TOL_ATTENTION


def test_attention_refuses_a_slot_outside_the_cache(registry):
    step = paged_step([(0, 3)], seed=4)
    step["slots"] = step["slots"].copy()
    step["slots"][1] = step["k_cache"].shape[0]
    k_cache, v_cache = step["k_cache"].copy(), step["v_cache"].copy()
    out = np.zeros((3, HEADS * HEAD_DIM), np.float32)
    operands = [step["q"], step["k"], step["v"], k_cache, v_cache, step["slots"], step["positions"], step["cu"],
                step["ctx"], step["tables"][:1], out]
    params = {"M": 3, "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "block_size": 16,
              "scale": 0.125, "dtype": "f32"}
    assert launch(row_of(registry, "attention", "libr4d"), operands, params) != 0


def test_a_decode_token_s_items_by_kv_head_or_by_query_head_give_the_same_bits(registry):
    """A decode token's items are its kv heads (each with its group's query heads) where there are at
    least as many as threads, else its query heads one by one: the same arithmetic per head, so the
    same bits either way, and every head's output written once."""
    from test_libr4d_pool import Threads

    step = paged_step([(300, 1)], num_blocks=40, seed=6)
    outs = {}
    for threads in (1, 2, KV_HEADS + 1):  # kv heads >= threads: grouped; fewer: head by head
        with Threads(registry, threads):
            outs[threads] = run_attention(registry, "libr4d", step)[0]
    ref, _, _ = run_attention(registry, "libref", step)
    assert rel_err(outs[1][:1], ref[:1]) <= TOL_ATTENTION
    np.testing.assert_array_equal(outs[1], outs[2])
    np.testing.assert_array_equal(outs[1], outs[KV_HEADS + 1])


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_attention_over_an_f16_cache(registry, case):
    """An f16 cache: the step's k, v stored rounded to nearest even (libref's numpy assignment), read
    back widened, so libr4d's row keeps f32's tolerance against libref's on the same cache, and
    both stay near the f32 cache's outputs (the rounding of k and v: about 2^-11 relative)."""
    step = paged_step(CASES[case], seed=len(case) + 10)
    ours, k_ours, v_ours = run_attention(registry, "libr4d", step, np.float16)
    ref, k_ref, v_ref = run_attention(registry, "libref", step, np.float16)
    assert k_ours.dtype == np.float16 and v_ours.dtype == np.float16
    np.testing.assert_array_equal(k_ours.view(np.uint16), k_ref.view(np.uint16))  # the same rounding
    np.testing.assert_array_equal(v_ours.view(np.uint16), v_ref.view(np.uint16))
    np.testing.assert_array_equal(k_ours[step["slots"]], step["k"].astype(np.float16))
    m = step["m"]
    assert rel_err(ours[:m], ref[:m]) <= TOL_ATTENTION, rel_err(ours[:m], ref[:m])
    assert (ours[m:] == 5.0).all()
    exact, _, _ = run_attention(registry, "libref", step)
    assert 0 < rel_err(ref[:m], exact[:m]) <= TOL_F16_CACHE, rel_err(ref[:m], exact[:m])


def test_an_f16_cache_stores_what_numpy_rounds_at_the_edges(registry):
    f16_store_rounds_as_numpy(registry)


def f16_store_rounds_as_numpy(registry):
    """Ties, subnormals, overflow and signed zeros rounded as numpy's astype(float16) by the f16
    cache's store (a width of 5: the scalar tail; test_libr4d_builds runs it on the portable build,
    whose f2h is C, not F16C)."""
    edges = np.array([1 + 2 ** -11, 1 + 3 * 2 ** -11, 65504.0, 65519.0, 65520.0, 1e9, -1e9, 2 ** -25,
                      3 * 2 ** -26, 2 ** -24 * 1.5, 6.1e-5, -0.0, 0.0, 2 ** -26, -2 ** -14 * 0.75], np.float32)
    heads, head_dim = 1, 5  # kv width 5: a scalar tail after nothing vectorised
    rng = np.random.default_rng(1)
    wide = (rng.standard_normal(16 * 5) * 2.0 ** rng.integers(-30, 20, 16 * 5)).astype(np.float32)  # every range
    for width_values in (edges[:5], edges[5:10], edges[10:], *wide.reshape(16, 5)):
        k = width_values.reshape(1, head_dim)
        v = -k
        q = rng.standard_normal((1, head_dim)).astype(np.float32)
        k_cache, v_cache = np.zeros((16, head_dim), np.float16), np.zeros((16, head_dim), np.float16)
        out = np.zeros((1, head_dim), np.float32)
        operands = [q, k, v, k_cache, v_cache, np.array([3], np.int32), np.array([0], np.int32),
                    np.array([0, 1], np.int32), np.array([1], np.int32), np.zeros((1, 1), np.int32), out]
        params = {"M": 1, "q_heads": heads, "kv_heads": heads, "head_dim": head_dim, "block_size": 16,
                  "scale": 1.0, "dtype": "f32"}
        with np.errstate(over="ignore"):
            assert launch(row_of(registry, "attention", "libr4d"), operands, params) == 0
            np.testing.assert_array_equal(k_cache[3].view(np.uint16), k[0].astype(np.float16).view(np.uint16))
            np.testing.assert_array_equal(v_cache[3].view(np.uint16), v[0].astype(np.float16).view(np.uint16))


def test_attention_refuses_caches_of_two_types(registry):
    step = paged_step([(0, 3)], seed=5)
    out = np.zeros((3, HEADS * HEAD_DIM), np.float32)
    operands = [step["q"], step["k"], step["v"], step["k_cache"].astype(np.float16), step["v_cache"].copy(),
                step["slots"], step["positions"], step["cu"], step["ctx"], step["tables"][:1], out]
    params = {"M": 3, "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "block_size": 16,
              "scale": 0.125, "dtype": "f32"}
    assert launch(row_of(registry, "attention", "libr4d"), operands, params) != 0
