"""libr4d's rows of Gemma 3's ops (rows_gemma.py, r4d_gemma.c) against libref's, at Gemma 3 270M's
widths (hidden 640, 4 query heads and one kv head of 256, ffn 2048): scale and rmsnorm_heads bit for
bit, gelu_tanh_mul within docs/LIBR4D.md's tolerance, sliding_attention over a paged cache with
windows shorter and longer than the contexts."""

import numpy as np
import pytest

import early_builds
import in_subprocess
from conftest import convert_gemma3
from test_libr4d_attention import paged_step
from test_libr4d_support import PREFILL_M, launch, make_weight, registry, rel_err, row_of  # noqa: F401

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 640, 4, 1, 256, 2048
TOL_GELU = 1e-9       # docs/LIBR4D.md: gelu through exp in f64, not tanh (measured 2e-15)
TOL_ATTENTION = 1e-5  # as attention's: FMA dot products of q and k


def both(registry, op, make_operands, params, weights=None):
    results = []
    for library in ("libr4d", "libref"):
        operands = make_operands()
        assert launch(row_of(registry, op, library), operands, params, weights) == 0, library
        results.append(operands)
    return results


def test_gemma_rows_are_libr4d_s(registry):
    for op in ("scale", "rmsnorm_heads", "gelu_tanh_mul", "sliding_attention"):
        assert row_of(registry, op, "libr4d").name == f"r4d_{op}"


@pytest.mark.parametrize("m", [1, PREFILL_M])
def test_scale_in_place_is_libref_s(registry, m):
    h = np.random.default_rng(m).standard_normal((m + 1, HIDDEN)).astype(np.float32)
    params = {"M": m, "n": HIDDEN, "scale": float(np.sqrt(np.float32(HIDDEN))), "dtype": "f32"}

    def operands():
        x = h.copy()
        return [x, x]

    ours, ref = both(registry, "scale", operands, params)
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[0][m:], h[m:])  # rows past M untouched


@pytest.mark.parametrize("m", [1, 8, PREFILL_M])
@pytest.mark.parametrize("heads", [HEADS, KV_HEADS])
def test_rmsnorm_heads_in_place_is_libref_s(registry, m, heads):
    rng = np.random.default_rng(m + heads)
    q = (rng.standard_normal((m + 2, heads * HEAD_DIM)) * rng.uniform(0.1, 30)).astype(np.float32)
    weight = make_weight("f32", 1, HEAD_DIM, seed=heads)
    params = {"M": m, "heads": heads, "head_dim": HEAD_DIM, "eps": 1e-6, "dtype": "f32"}

    def operands():
        x = q.copy()
        return [x, None, x]

    ours, ref = both(registry, "rmsnorm_heads", operands, params, {1: weight})
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[0][m:], q[m:])


def test_rmsnorm_heads_refuses_a_buffer_of_another_width(registry):
    x = np.zeros((2, HEADS * HEAD_DIM + 8), np.float32)
    params = {"M": 2, "heads": HEADS, "head_dim": HEAD_DIM, "eps": 1e-6, "dtype": "f32"}
    weight = make_weight("f32", 1, HEAD_DIM, seed=1)
    assert launch(row_of(registry, "rmsnorm_heads", "libr4d"), [x, None, x], params, {1: weight}) != 0


@pytest.mark.filterwarnings("ignore:overflow encountered")
@pytest.mark.parametrize("m", [1, PREFILL_M])
def test_gelu_tanh_mul_in_place_agrees_with_libref(registry, m):
    rng = np.random.default_rng(m)
    gate = (rng.standard_normal((m, FFN)) * 3).astype(np.float32)
    gate[0, :8] = [0.0, -0.0, 30.0, -30.0, 1e-30, -800.0, 800.0, 5.0]
    up = rng.standard_normal((m, FFN)).astype(np.float32)
    params = {"M": m, "n": FFN, "dtype": "f32"}

    def operands():
        g = gate.copy()
        return [g, up.copy(), g]  # the gemma3 graph writes y over gate

    ours, ref = both(registry, "gelu_tanh_mul", operands, params)
    assert rel_err(ours[0], ref[0]) <= TOL_GELU, rel_err(ours[0], ref[0])
    # where libref's 1 + tanh(z) has not cancelled (gate > -3), the same f32 but for rare last-bit roundings
    plain = gate > -3
    assert np.mean(ours[0][plain] == ref[0][plain]) > 0.999
    np.testing.assert_array_equal(ours[0][0, :3], ref[0][0, :3])  # 0, -0 (its sign), and gelu(30) = 30


def run_sliding(registry, library, step, window, op="sliding_attention"):
    k_cache, v_cache = step["k_cache"].copy(), step["v_cache"].copy()
    out = np.full((step["m"] + 2, HEADS * HEAD_DIM), 5.0, np.float32)
    operands = [step["q"], step["k"], step["v"], k_cache, v_cache, step["slots"], step["positions"], step["cu"],
                step["ctx"], step["tables"][:len(step["ctx"])], out]
    params = {"M": step["m"], "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
              "block_size": step["block_size"], "scale": HEAD_DIM ** -0.5, "dtype": "f32"}
    if op == "sliding_attention":
        params["window"] = window
    assert launch(row_of(registry, op, library), operands, params) == 0
    return out, k_cache, v_cache


def gemma_step(seqs, seed, num_blocks=96):
    """paged_step's operands at Gemma's heads: 4 query heads over one kv head of 256."""
    step = paged_step(seqs, num_blocks=num_blocks, seed=seed)
    rng = np.random.default_rng(seed + 100)
    m, slots = step["m"], step["k_cache"].shape[0]
    step["q"] = rng.standard_normal((m, HEADS * HEAD_DIM)).astype(np.float32) * 2
    for name, rows in (("k", m), ("v", m), ("k_cache", slots), ("v_cache", slots)):
        step[name] = rng.standard_normal((rows, KV_HEADS * HEAD_DIM)).astype(np.float32)
    return step


WINDOWS = {
    "prefill and decode, window 8": ([(0, 20), (40, 1), (33, 7), (0, 1)], 8),
    "decode batch, window 16": ([(5, 1), (130, 1), (16, 1), (15, 1)], 16),
    "long prefill chunk, window 512": ([(1000, PREFILL_M)], 512),
    "window 1": ([(3, 5), (20, 1)], 1),
}


@pytest.mark.parametrize("case", list(WINDOWS), ids=list(WINDOWS))
def test_sliding_attention_over_a_paged_cache(registry, case):
    seqs, window = WINDOWS[case]
    step = gemma_step(seqs, seed=len(case), num_blocks=160)
    ours, k_ours, v_ours = run_sliding(registry, "libr4d", step, window)
    ref, k_ref, v_ref = run_sliding(registry, "libref", step, window)
    np.testing.assert_array_equal(k_ours, k_ref)
    np.testing.assert_array_equal(v_ours, v_ref)
    m = step["m"]
    assert rel_err(ours[:m], ref[:m]) <= TOL_ATTENTION, rel_err(ours[:m], ref[:m])
    assert (ours[m:] == 5.0).all()


def test_a_window_past_every_context_is_attention(registry):
    step = gemma_step([(0, 20), (40, 1)], seed=7)
    windowed, _, _ = run_sliding(registry, "libr4d", step, 4096)
    whole, _, _ = run_sliding(registry, "libr4d", step, 0, op="attention")
    np.testing.assert_array_equal(windowed, whole)
    narrow, _, _ = run_sliding(registry, "libr4d", step, 4)
    assert not np.array_equal(narrow[:step["m"]], whole[:step["m"]])


def greedy(model, kernels, prompt, steps):
    from radiance.config import Config
    from radiance.generation.sequence import SamplingParams
    from radiance.launch import engine_over, open_ranks

    config = Config(model=str(model), radiance_home="", kernels=kernels, accept_reference=kernels == "libref",
                    max_context=64, progress=False)
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        sequence = engine.add(engine.text.encode(prompt), SamplingParams(max_tokens=steps, temperature=0,
                                                                          ignore_eos=True))
        while not sequence.finished:
            engine.step()
        return sequence.output_ids


PROMPT = "The capital of France is"


def oracle_tokens() -> list:
    """libref's 5 greedy tokens of Gemma 3 270M, in a process of its own: an early build (libref's
    ordered f32 sums in numpy take a core for tens of seconds), run beside the tests before."""
    return in_subprocess.call("test_libr4d_gemma", "greedy", early_builds.result("gemma3-rad", convert_gemma3),
                              "libref", PROMPT, 5)


EARLY_BUILDS = {"gemma3-libref-tokens": oracle_tokens}


def test_gemma3_270m_on_libr4d_alone_gives_libref_s_tokens(gemma3):
    """Every op and weight format of the real file on libr4d rows (no reference row accepted)."""
    assert greedy(gemma3, "libr4d", PROMPT, 5) == early_builds.result("gemma3-libref-tokens", oracle_tokens)


def gemma_rows_agree(registry, reference):
    """The four rows of `registry`'s libr4d against `reference`'s libref, small (test_libr4d_builds
    runs it on the portable C build and on the numpy fallback)."""
    rng = np.random.default_rng(11)
    x0 = rng.standard_normal((3, HEADS * HEAD_DIM)).astype(np.float32)
    weight = make_weight("f32", 1, HEAD_DIM, seed=2)
    gate, up = (rng.standard_normal((3, 300)) * 3).astype(np.float32), rng.standard_normal((3, 300)).astype(np.float32)
    step = gemma_step([(0, 9), (20, 1)], seed=3)
    found = []
    for reg, library in ((registry, "libr4d"), (reference, "libref")):
        scaled, normed, y = x0.copy(), x0.copy(), np.zeros_like(gate)
        assert launch(row_of(reg, "scale", library), [x0, scaled], {"M": 3, "n": HEADS * HEAD_DIM, "scale": 25.3,
                                                                       "dtype": "f32"}) == 0
        assert launch(row_of(reg, "rmsnorm_heads", library), [normed, None, normed],
                      {"M": 3, "heads": HEADS, "head_dim": HEAD_DIM, "eps": 1e-6, "dtype": "f32"}, {1: weight}) == 0
        assert launch(row_of(reg, "gelu_tanh_mul", library), [gate, up, y], {"M": 3, "n": 300, "dtype": "f32"}) == 0
        found.append((scaled, normed, y, run_sliding(reg, library, step, 4)[0]))
    ours, ref = found
    np.testing.assert_array_equal(ours[0], ref[0])
    np.testing.assert_array_equal(ours[1], ref[1])
    assert rel_err(ours[2], ref[2]) <= TOL_GELU
    assert rel_err(ours[3][:step["m"]], ref[3][:step["m"]]) <= TOL_ATTENTION
