"""libr4d's device rows on a real card against libref's rows, on SmolLM2-135M's geometries (q4_1
linear weights, the q8_0 tied table / lm head) and Llama-3-8B-shaped bf16 ones, decode and prefill
M, attention over 2-3 sequences mixing prefill and decode. Tolerances: device_kernels.TOLERANCE
(docs/LIBR4D.md 'Device rows'). Skips where no card is visible."""

import numpy as np
import pytest

from test_device_rows_support import Card, card
from test_libr4d_support import (  # noqa: F401 (registry is a fixture)
    FFN, HEAD_DIM, HEADS, HIDDEN, KV_HEADS, LINEAR, VOCAB, activations, launch, make_weight, registry, rel_err,
    row_of,
)

DEVICE, STREAM, WHY = card()
pytestmark = pytest.mark.skipif(DEVICE is None, reason=f"device rows need a card: {WHY}")
LLAMA = dict(hidden=4096, heads=32, kv=8, head_dim=128, ffn=14336, vocab=128256)
LLAMA_LINEAR = [("gate", 14336, 4096), ("down", 4096, 14336), ("o", 4096, 4096),
                ("k_tp2", 512, 4096), ("o_tp2", 4096, 2048)]  # the last three split K (narrow shapes)


@pytest.fixture(scope="module")
def on_card():
    c = Card(DEVICE, STREAM)
    yield c
    c.close()


def dev_row(registry, name):
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return next(row for row in lib.rows if row.name == name)


def tolerance(registry, op):
    import importlib
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return importlib.import_module(f"{lib.module.__name__}.device_kernels").TOLERANCE[op]


def ref(registry, op, operands, params, weights=None, read=()):
    arrays = [None if (weights and i in weights) else np.array(o, copy=True) for i, o in enumerate(operands)]
    assert launch(row_of(registry, op, "libref"), arrays, params, weights) == 0
    return {i: arrays[i] for i in read}


def check(registry, op, row_name, on_card, operands, params, weights=None, read=(), kind=None):
    got = on_card.run(dev_row(registry, row_name), operands, params, weights, read)
    want = ref(registry, op, operands, params, weights, read)
    limit = tolerance(registry, kind or op)
    for i in read:
        err = rel_err(got[i], want[i]) if limit else 0.0
        if limit == 0.0:
            np.testing.assert_array_equal(got[i], want[i], err_msg=row_name)
        assert err <= limit, (row_name, i, err)
    return got, want


@pytest.mark.parametrize("fmt,vocab,n", [("q8_0", VOCAB, HIDDEN), ("q4_1", 4096, HIDDEN), ("bf16", 2000, 4096),
                                         ("f16", 1000, HIDDEN), ("f32", 1000, HIDDEN)])
def test_embedding(registry, on_card, fmt, vocab, n):
    ids = np.random.default_rng(0).integers(0, vocab, 64).astype(np.int32)
    ids[:2] = [0, vocab - 1]
    params = {"M": 64, "n": n, "vocab": vocab, "wdtype": fmt, "dtype": "f32"}
    check(registry, "embedding", "r4dchain_embedding_dev", on_card, [ids, None, np.zeros((64, n), np.float32)], params,
          {1: make_weight(fmt, vocab, n, 21)}, read=(2,))


@pytest.mark.parametrize("m,n", [(1, HIDDEN), (64, HIDDEN), (3, 4096), (64, 4096)])
def test_rmsnorm_add_silu_take_rows(registry, on_card, m, n):
    x, b = activations(m, n, 1), activations(m, n, 2)
    w = make_weight("f32", 1, n, 3)
    y = np.zeros((m, n), np.float32)
    check(registry, "rmsnorm", "r4dchain_rmsnorm_dev", on_card, [x, None, y], {"M": m, "n": n, "eps": 1e-5, "dtype": "f32"},
          {1: w}, read=(2,))
    params = {"M": m, "n": n, "dtype": "f32"}
    check(registry, "add", "r4dchain_add_dev", on_card, [x, b, y], params, read=(2,))
    check(registry, "silu_mul", "r4dchain_silu_mul_dev", on_card, [x, b, y], params, read=(2,))
    index = np.random.default_rng(4).integers(0, m, m).astype(np.int32)
    check(registry, "take_rows", "r4dchain_take_rows_dev", on_card, [x, index, y], params, read=(2,))


@pytest.mark.parametrize("heads,kv,d,interleaved,theta", [(HEADS, KV_HEADS, HEAD_DIM, 1, 10000.0),
                                                            (32, 8, 128, 0, 500000.0)])
@pytest.mark.parametrize("m", [1, 64])
def test_rope(registry, on_card, heads, kv, d, interleaved, theta, m):
    q, k = activations(m, heads * d, 5), activations(m, kv * d, 6)
    positions = np.random.default_rng(7).integers(0, 8192, m).astype(np.int32)
    inv_freq = (1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)).astype(np.float32)
    params = {"M": m, "q_heads": heads, "kv_heads": kv, "head_dim": d, "interleaved": interleaved, "dtype": "f32"}
    check(registry, "rope", "r4dchain_rope_dev", on_card, [q, k, positions, inv_freq], params, read=(0, 1))


_WEIGHTS: dict = {}


def gemm_case(registry, on_card, fmt, n, k, m, seed):
    if (fmt, n, k, seed) not in _WEIGHTS:
        _WEIGHTS[(fmt, n, k, seed)] = make_weight(fmt, n, k, seed)
    weight = _WEIGHTS[(fmt, n, k, seed)]
    x = activations(m, k, seed + 1)
    label = fmt if fmt in ("q4_1", "q8_0") else "plain"
    name = f"r4dchain_gemv_{label}_dev" if m <= 8 else f"r4dchain_gemm_{label}_dev"
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    return check(registry, "gemm", name, on_card, [x, None, np.zeros((m, n), np.float32)], params, {1: weight},
                 read=(2,), kind="gemv" if m <= 8 else "gemm")


@pytest.mark.parametrize("name,n,k", LINEAR, ids=[item[0] for item in LINEAR])
@pytest.mark.parametrize("m", [1, 3, 64])
def test_gemm_smollm2_q4_1(registry, on_card, name, n, k, m):
    gemm_case(registry, on_card, "q4_1", n, k, m, seed=n + k)


@pytest.mark.parametrize("m", [1, 4, 8, 64])
def test_gemm_smollm2_q8_0_lm_head(registry, on_card, m):
    got, want = gemm_case(registry, on_card, "q8_0", VOCAB, HIDDEN, m, seed=11)
    np.testing.assert_array_equal(np.argmax(got[2], axis=1), np.argmax(want[2], axis=1))


@pytest.mark.parametrize("name,n,k", LLAMA_LINEAR, ids=[item[0] for item in LLAMA_LINEAR])
@pytest.mark.parametrize("m", [1, 4, 64])
def test_gemm_llama8b_bf16(registry, on_card, name, n, k, m):
    gemm_case(registry, on_card, "bf16", n, k, m, seed=3)


@pytest.mark.parametrize("fmt", ["f32", "f16"])
@pytest.mark.parametrize("m", [2, 37])
def test_gemm_plain(registry, on_card, fmt, m):
    gemm_case(registry, on_card, fmt, 96, 576, m, seed=5)


def attention_case(registry, on_card, heads, kv, d, sequences, block_size=16, seed=0):
    """sequences: (first position, new tokens); the cache holds random rows for earlier positions."""
    rng = np.random.default_rng(seed)
    seqs = len(sequences)
    lengths = [p + t for p, t in sequences]
    max_blocks = max(-(-n // block_size) for n in lengths)
    blocks = rng.permutation(seqs * max_blocks + 4)[: seqs * max_blocks].reshape(seqs, max_blocks).astype(np.int32)
    num_slots = (seqs * max_blocks + 4) * block_size
    width = kv * d
    k_cache = rng.standard_normal((num_slots, width)).astype(np.float32)
    v_cache = rng.standard_normal((num_slots, width)).astype(np.float32)
    positions, slots = [], []
    for s, (first, count) in enumerate(sequences):
        for j in range(first, first + count):
            positions.append(j)
            slots.append(blocks[s, j // block_size] * block_size + j % block_size)
    m = len(positions)
    cu = np.concatenate([[0], np.cumsum([t for _, t in sequences])]).astype(np.int32)
    operands = [rng.standard_normal((m, heads * d)).astype(np.float32), rng.standard_normal((m, width)).astype(np.float32),
                rng.standard_normal((m, width)).astype(np.float32), k_cache, v_cache, np.array(slots, np.int32),
                np.array(positions, np.int32), cu, np.array(lengths, np.int32), blocks,
                np.zeros((m, heads * d), np.float32)]
    params = {"M": m, "q_heads": heads, "kv_heads": kv, "head_dim": d, "block_size": block_size,
              "scale": 1.0 / np.sqrt(d), "dtype": "f32", "seqs": seqs}
    got = on_card.run(dev_row(registry, "r4dchain_attention_dev"), operands, params, read=(3, 4, 10))
    want = ref(registry, "attention", operands, params, read=(3, 4, 10))
    np.testing.assert_array_equal(got[3], want[3])
    np.testing.assert_array_equal(got[4], want[4])
    assert rel_err(got[10], want[10]) <= tolerance(registry, "attention"), rel_err(got[10], want[10])


def test_attention_smollm2_prefill_decode_and_a_chunk(registry, on_card):
    attention_case(registry, on_card, HEADS, KV_HEADS, HEAD_DIM, [(0, 20), (40, 1), (10, 7)])


def test_attention_llama8b_decode_and_prefill(registry, on_card):
    attention_case(registry, on_card, 32, 8, 128, [(300, 1), (0, 64), (77, 1)], seed=1)


def test_sample_greedy_is_the_first_maximum(registry, on_card):
    rng = np.random.default_rng(9)
    logits = rng.standard_normal((4, VOCAB)).astype(np.float32)
    logits[0, [5, 900, 40000]] = 50.0  # ties: the first wins
    logits[1, [7, 8]] = np.nan          # np.argmax: the first NaN
    logits[2, :] = 1.0
    zeros = np.zeros(4, np.float32)
    operands = [logits, zeros, np.zeros(4, np.int32), np.ones(4, np.float32), np.zeros((4, 2), np.uint64),
                np.full(4, -1, np.int32)]
    params = {"M": 4, "vocab": VOCAB}
    got = on_card.run(dev_row(registry, "r4dchain_sample_dev"), operands, params, read=(5,))[5]
    np.testing.assert_array_equal(got, np.argmax(logits, axis=1))
    np.testing.assert_array_equal(got, ref(registry, "sample", operands, params, read=(5,))[5])


@pytest.mark.parametrize("vocab", [VOCAB, LLAMA["vocab"]])
def test_sample_with_temperature_is_libref_s_token(registry, on_card, vocab):
    rng = np.random.default_rng(vocab)
    rows = 12
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(np.float32)
    logits[3, :] = 0.5              # flat: the whole vocabulary is the head
    logits[4, ::2] = 7.0            # many ties
    temperature = np.array([0.7, 1.0, 0.3, 1.0, 0.9, 0.0, 1.5, 0.8, 2.0, 1.0, 0.6, 1.2], np.float32)
    top_k = np.array([0, 40, 0, 0, 100, 0, 5, 0, 50000, 1, 0, 3], np.int32)
    top_p = np.array([1.0, 1.0, 0.9, 0.5, 0.95, 1.0, 0.7, 0.01, 1.0, 1.0, 0.99, 1.0], np.float32)
    rng_words = np.stack([np.arange(rows, dtype=np.uint64) * 7919 + 3, np.arange(rows, dtype=np.uint64) + 11], 1)
    tokens = np.full(rows, -1, np.int32)
    operands = [logits, temperature, top_k, top_p, rng_words, tokens]
    params = {"M": rows, "vocab": vocab}
    for step in range(3):
        operands[4] = rng_words + np.array([0, step], np.uint64)
        got = on_card.run(dev_row(registry, "r4dchain_sample_dev"), operands, params, read=(5,))[5]
        want = ref(registry, "sample", operands, params, read=(5,))[5]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt,n,k", [("bf16", 512, 4096), ("q8_0", 256, 4096), ("q4_1", 512, 8192)])
def test_a_split_k_gemv_gives_the_same_bits_launch_after_launch(registry, on_card, fmt, n, k):
    """Its last block per row group resets the group's counter: a second launch (a graph replay)
    with the same scratch must add the chunks again, in the same order."""
    label = fmt if fmt in ("q4_1", "q8_0") else "plain"
    row = dev_row(registry, f"r4dchain_gemv_{label}_dev")
    params = {"M": 2, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    operands = [activations(2, k, 5), None, np.zeros((2, n), np.float32)]
    a = on_card.args(row, operands, params, {1: make_weight(fmt, n, k, 9)})
    assert a.scratch_bytes > 0, "this shape should split K"
    first = on_card.replays_agree(row, a, 2, operands[2])
    want = ref(registry, "gemm", operands, params, {1: make_weight(fmt, n, k, 9)}, read=(2,))[2]
    assert rel_err(first, want) <= tolerance(registry, "gemv")


# ---- the fused rows: each against libref's reference row, which runs the chain it replaces ------

def check_fused(registry, op, row_name, on_card, operands, params, weights, tolerances):
    """`tolerances`: operand index -> the TOLERANCE kind it is held to (0.0 kinds: equal bits)."""
    got = on_card.run(dev_row(registry, row_name), operands, params, weights, read=tuple(tolerances))
    want = ref(registry, op, operands, params, weights, read=tuple(tolerances))
    for i, kind in tolerances.items():
        limit = tolerance(registry, kind)
        if limit == 0.0:
            np.testing.assert_array_equal(got[i], want[i], err_msg=f"{row_name} operand {i}")
        else:
            assert rel_err(got[i], want[i]) <= limit, (row_name, i, rel_err(got[i], want[i]))
    return got, want


FUSED_SHAPES = [("q4_1", HIDDEN, (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM), FFN),
                ("bf16", LLAMA["hidden"], (4096, 1024), LLAMA["ffn"])]


@pytest.mark.parametrize("fmt,hidden,qk,ffn", FUSED_SHAPES, ids=["smollm2", "llama8b"])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_rmsnorm_gemm3_and_gate_up(registry, on_card, fmt, hidden, qk, ffn, m):
    label = fmt if fmt in ("q4_1", "q8_0") else "plain"
    x, norm = activations(m, hidden, 31), make_weight("f32", 1, hidden, 32)
    (nq, nk), zeros = qk, lambda n: np.zeros((m, n), np.float32)
    weights = {1: norm, 3: make_weight(fmt, nq, hidden, 33), 5: make_weight(fmt, nk, hidden, 34),
               7: make_weight(fmt, nk, hidden, 35)}
    params = {"M": m, "n": hidden, "eps": 1e-5, "K": hidden, "N.1": nq, "N.2": nk, "N.3": nk, "wdtype": fmt,
              "dtype": "f32"}
    check_fused(registry, "rmsnorm_gemm3", f"r4dchain_rmsnorm_gemm3_{label}_dev", on_card,
                [x, None, zeros(hidden), None, zeros(nq), None, zeros(nk), None, zeros(nk)], params, weights,
                {2: "rmsnorm", 4: "gemv", 6: "gemv", 8: "gemv"})
    weights = {1: norm, 3: make_weight(fmt, ffn, hidden, 36), 5: make_weight(fmt, ffn, hidden, 37)}
    params = {"M": m, "n.0": hidden, "eps": 1e-5, "K": hidden, "N.1": ffn, "N.2": ffn, "wdtype": fmt, "dtype": "f32"}
    check_fused(registry, "rmsnorm_gemm2_silu_mul", f"r4dchain_rmsnorm_gemm2_silu_mul_{label}_dev", on_card,
                [x, None, zeros(hidden), None, zeros(ffn), None, zeros(ffn)], params, weights,
                {2: "rmsnorm", 4: "gemv", 6: "gemv"})


@pytest.mark.parametrize("fmt", ["bf16", "q8_0", "q4_1"])
@pytest.mark.parametrize("m", [1, 3])
def test_the_stream_gemv_gives_the_split_kernels_bits(registry, on_card, monkeypatch, fmt, m):
    """gemv_stream.cu (opt-in, R4D_GEMV_STREAM) runs gemv.cu's arithmetic in its order: where gemv.cu
    does not split K (gate and up, 28672 rows), the fused gate/up row gives the same bits with either,
    and agrees with libref's chain. (The band on gemv.cu: on Hopper bf16 at M = 3 would take the skinny
    band, which reads neither.)"""
    import importlib
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    dk = importlib.import_module(f"{lib.module.__name__}.device_kernels")
    monkeypatch.setattr(importlib.import_module(f"{lib.module.__name__}.device_tensor_cores"), "BAND_KERNEL", "gemv")
    label = fmt if fmt in ("q4_1", "q8_0") else "plain"
    hidden, ffn = LLAMA["hidden"], LLAMA["ffn"]
    assert dk.gemv_split(2 * ffn, hidden, fmt)[0] == 1
    x, norm = activations(m, hidden, 51), make_weight("f32", 1, hidden, 52)
    weights = {1: norm, 3: make_weight(fmt, ffn, hidden, 53), 5: make_weight(fmt, ffn, hidden, 54)}
    params = {"M": m, "n.0": hidden, "eps": 1e-5, "K": hidden, "N.1": ffn, "N.2": ffn, "wdtype": fmt, "dtype": "f32"}
    operands = [x, None, np.zeros((m, hidden), np.float32), None, np.zeros((m, ffn), np.float32), None,
                np.zeros((m, ffn), np.float32)]
    row = dev_row(registry, f"r4dchain_rmsnorm_gemm2_silu_mul_{label}_dev")
    results = {}
    for cut in (None, dk.StreamShape()):
        monkeypatch.setattr(dk, "STREAM", cut)
        results[cut is not None] = on_card.run(row, operands, params, weights, read=(2, 4, 6))
    for i in (2, 4, 6):
        np.testing.assert_array_equal(results[True][i], results[False][i], err_msg=f"operand {i}")
    want = ref(registry, "rmsnorm_gemm2_silu_mul", operands, params, weights, read=(4, 6))
    for i in (4, 6):
        assert rel_err(results[True][i], want[i]) <= tolerance(registry, "gemv")


@pytest.mark.parametrize("fmt,n,k", [("q4_1", HIDDEN, FFN), ("bf16", 4096, 14336), ("bf16", 4096, 2048)])
@pytest.mark.parametrize("m", [1, 8])
def test_gemm_add(registry, on_card, fmt, n, k, m):
    label = fmt if fmt in ("q4_1", "q8_0") else "plain"
    params = {"M": m, "N": n, "K": k, "n": n, "wdtype": fmt, "dtype": "f32"}
    check_fused(registry, "gemm_add", f"r4dchain_gemm_add_{label}_dev", on_card,
                [activations(m, k, 41), None, np.zeros((m, n), np.float32), activations(m, n, 42)], params,
                {1: make_weight(fmt, n, k, 43)}, {2: "gemv", 3: "gemv"})


@pytest.mark.parametrize("heads,kv,d,interleaved,sequences", [
    (HEADS, KV_HEADS, HEAD_DIM, 1, [(40, 1), (3, 2), (700, 1)]),
    (32, 8, 128, 0, [(511, 1)]), (32, 8, 128, 0, [(0, 5), (1000, 1), (17, 2)]),
    # decode steps of several sequences: attention_decode.cu's r4d_attend_decode_rope
    (HEADS, KV_HEADS, HEAD_DIM, 1, [(40, 1), (3, 1), (700, 1)]),
    (32, 8, 128, 0, [(p, 1) for p in (0, 31, 500, 1200, 77, 4000, 16, 2047)])])
def test_rope_attention(registry, on_card, heads, kv, d, interleaved, sequences):
    """Fused: this step's keys rotated and read from k, v; the cache, q and k left as rope and
    attention leave them."""
    rng = np.random.default_rng(d + len(sequences))
    block_size = 16
    lengths = [p + t for p, t in sequences]
    max_blocks = max(-(-n // block_size) for n in lengths)
    seqs = len(sequences)
    blocks = rng.permutation(seqs * max_blocks + 4)[: seqs * max_blocks].reshape(seqs, max_blocks).astype(np.int32)
    width = kv * d
    k_cache = rng.standard_normal(((seqs * max_blocks + 4) * block_size, width)).astype(np.float32)
    v_cache = rng.standard_normal(k_cache.shape).astype(np.float32)
    positions = [j for first, count in sequences for j in range(first, first + count)]
    slots = [blocks[s, j // block_size] * block_size + j % block_size
             for s, (first, count) in enumerate(sequences) for j in range(first, first + count)]
    m = len(positions)
    cu = np.concatenate([[0], np.cumsum([t for _, t in sequences])]).astype(np.int32)
    inv_freq = (1.0 / 10000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d)).astype(np.float32)
    operands = [rng.standard_normal((m, heads * d)).astype(np.float32), rng.standard_normal((m, width)).astype(np.float32),
                np.array(positions, np.int32), inv_freq, rng.standard_normal((m, width)).astype(np.float32), k_cache,
                v_cache, np.array(slots, np.int32), cu, np.array(lengths, np.int32), blocks,
                np.zeros((m, heads * d), np.float32)]
    params = {"M": m, "q_heads": heads, "kv_heads": kv, "head_dim": d, "interleaved": interleaved,
              "block_size": block_size, "scale": 1.0 / np.sqrt(d), "dtype": "f32"}
    check_fused(registry, "rope_attention", "r4dchain_rope_attention_dev", on_card, operands, params, None,
                {0: "rope", 1: "rope", 5: "rope", 6: "add", 11: "attention"})


@pytest.mark.parametrize("fmt,hidden,vocab", [("q8_0", HIDDEN, VOCAB), ("bf16", 4096, LLAMA["vocab"])])
def test_the_fused_lm_head_samples_what_the_chain_samples(registry, on_card, fmt, hidden, vocab):
    label = fmt if fmt in ("q4_1", "q8_0") else "plain"
    m, rows = 4, 9
    h = activations(rows, hidden, 51)
    index = np.array([8, 0, 3, 5], np.int32)
    temperature = np.array([0.0, 0.8, 0.0, 1.3], np.float32)
    operands = [h, index, np.zeros((m, hidden), np.float32), None, np.zeros((m, hidden), np.float32), None,
                np.zeros((m, vocab), np.float32), temperature, np.array([0, 40, 0, 0], np.int32),
                np.array([1.0, 0.9, 1.0, 1.0], np.float32),
                np.array([[7, 3], [11, 4], [13, 5], [17, 6]], np.uint64), np.full(m, -1, np.int32)]
    params = {"M": m, "n": hidden, "eps": 1e-5, "N": vocab, "K": hidden, "wdtype": fmt, "dtype": "f32", "vocab": vocab}
    weights = {3: make_weight("f32", 1, hidden, 52), 5: make_weight(fmt, vocab, hidden, 53)}
    got = on_card.run(dev_row(registry, f"r4dchain_take_rows_rmsnorm_gemm_sample_{label}_dev"), operands, params,
                      weights, read=(2, 4, 6, 11))
    want = ref(registry, "take_rows_rmsnorm_gemm_sample", operands, params, weights, read=(2, 4, 6, 11))
    np.testing.assert_array_equal(got[2], want[2])
    assert rel_err(got[4], want[4]) <= tolerance(registry, "rmsnorm")
    assert rel_err(got[6], want[6]) <= tolerance(registry, "gemv")
    # greedy rows: the first maximum of the logits; the others: libref's draw over these logits
    np.testing.assert_array_equal(got[11][[0, 2]], np.argmax(got[6][[0, 2]], axis=1))
    np.testing.assert_array_equal(got[11][[0, 2]], want[11][[0, 2]])
    drawn = ref(registry, "sample", [got[6], *operands[7:]], {"M": m, "vocab": vocab}, read=(5,))[5]
    np.testing.assert_array_equal(got[11][[1, 3]], drawn[[1, 3]])
