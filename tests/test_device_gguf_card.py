"""On a real card: libr4d's device rows for the GGUF block types (device_gguf_rows.py) and for Gemma 3's
ops (device_gemma_rows.py) against libref, at Llama-3-8B's linear shapes and Gemma 3 270M's, decode
and prefill M; then Gemma 3 270M (Q4_K_M: q5_0, q4_k, q6_k and q8_0 weights) decoding greedily on the
card gives the host path's tokens. Skips where no card is visible, saying why. Without a card the
same rows run on the fake card: test_device_gguf_rows.py, test_device_gemma_rows.py."""

import numpy as np
import pytest

from test_device_rows_support import Card, card
from test_device_tensor_cores import attention_operands
from test_libr4d_kquants import TYPES, gguf_weight
from test_libr4d_support import activations, launch, plain_weight, registry, rel_err, row_of  # noqa: F401 (registry)

DEVICE, STREAM, WHY = card()
pytestmark = pytest.mark.skipif(DEVICE is None, reason=f"device rows need a card: {WHY}")
NAMES = [qtype.name.lower() for qtype in TYPES]
LLAMA_8B = [("q", 4096, 4096), ("gate", 14336, 4096), ("down", 4096, 14336)]
GEMMA = [("q5_0", 1024, 640), ("q5_0", 2048, 640), ("q4_k", 640, 1024), ("q6_k", 640, 2048), ("q5_0", 256, 640)]


@pytest.fixture(scope="module")
def on_card():
    c = Card(DEVICE, STREAM)
    yield c
    c.close()


def module(registry, name):
    import importlib
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return importlib.import_module(f"{lib.module.__name__}.{name}")


def dev_row(registry, name):
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return next(row for row in lib.rows if row.name == name)


_WEIGHTS: dict = {}


def weight_of(fmt, n, k):
    if (fmt, n, k) not in _WEIGHTS:
        qtype = next(q for q in TYPES if q.name.lower() == fmt)
        _WEIGHTS[(fmt, n, k)] = gguf_weight(qtype, n, k, seed=n + k)[0]
    return _WEIGHTS[(fmt, n, k)]


def gemm_agrees(registry, on_card, fmt, n, k, m):
    weight = weight_of(fmt, n, k)
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    x = activations(m, k, m)
    name = f"r4dchain_{'gemv' if m <= 8 else 'gemm'}_{fmt}_dev"
    got = on_card.run(dev_row(registry, name), [x, None, np.full((m, n), np.nan, np.float32)], params, {1: weight},
                      read=(2,))[2]
    want = np.zeros((m, n), np.float32)
    assert launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == 0
    err = rel_err(got, want)
    assert np.isfinite(got).all() and err <= module(registry, "device_kernels").TOLERANCE["gemv"], (name, n, k, m, err)


@pytest.mark.parametrize("fmt", NAMES)
@pytest.mark.parametrize("shape", LLAMA_8B, ids=[s[0] for s in LLAMA_8B])
@pytest.mark.parametrize("m", [1, 9])
def test_gguf_rows_at_llama_8b_shapes(registry, on_card, fmt, shape, m):
    _, n, k = shape
    gemm_agrees(registry, on_card, fmt, n, k, m)


@pytest.mark.parametrize("fmt,n,k", GEMMA, ids=[f"{f}_{n}x{k}" for f, n, k in GEMMA])
@pytest.mark.parametrize("m", [1, 3, 8, 40])
def test_gguf_rows_at_gemma3_270m_shapes(registry, on_card, fmt, n, k, m):
    gemm_agrees(registry, on_card, fmt, n, k, m)


@pytest.mark.parametrize("fmt", NAMES)
def test_gguf_embedding_row(registry, on_card, fmt):
    from test_device_gguf_rows import embedding_agrees
    embedding_agrees(registry, on_card, fmt, 32000, 4096 if fmt.endswith("_k") else 640, m=64)


def gemma_agrees(registry, on_card, op, operands, params, read, weights=None):
    tolerance = module(registry, "device_gemma_rows").TOLERANCE[op]
    name = f"r4dchain_{op}_dev"
    got = on_card.run(dev_row(registry, name), operands, params, weights, read)
    arrays = [None if weights and i in weights else np.array(o, copy=True) for i, o in enumerate(operands)]
    assert launch(row_of(registry, op, "libref"), arrays, params, weights) == 0
    for i in read:
        if tolerance == 0.0:
            np.testing.assert_array_equal(got[i], arrays[i], err_msg=name)
        else:
            assert rel_err(got[i], arrays[i]) <= tolerance, (name, i, rel_err(got[i], arrays[i]))
    return got, arrays


@pytest.mark.parametrize("m", [1, 40])
def test_gemma_elementwise_rows(registry, on_card, m):
    x = activations(m, 640, m)
    gemma_agrees(registry, on_card, "scale", [x, np.zeros_like(x)],
                 {"M": m, "n": 640, "scale": float(np.sqrt(640.0)), "dtype": "f32"}, read=(1,))
    gate, up = activations(m, 2048, m + 1) * 2, activations(m, 2048, m + 2)
    gemma_agrees(registry, on_card, "gelu_tanh_mul", [gate, up, np.zeros_like(gate)],
                 {"M": m, "n": 2048, "dtype": "f32"}, read=(2,))
    for heads in (4, 1):
        q = activations(m, heads * 256, heads)
        w = plain_weight(1.0 + np.random.default_rng(3).standard_normal((1, 256)).astype(np.float32) * 0.1, "f32")
        gemma_agrees(registry, on_card, "rmsnorm_heads", [q, None, np.zeros_like(q)],
                     {"M": m, "heads": heads, "head_dim": 256, "eps": 1e-6, "dtype": "f32"}, read=(2,), weights={1: w})


@pytest.mark.parametrize("sequences", [[(p, 1) for p in (3, 511, 512, 513, 1000, 4000)], [(400, 200), (700, 1)]],
                         ids=["decode", "chunk"])
def test_sliding_attention_row(registry, on_card, sequences):
    operands, params = attention_operands(4, 1, 256, sequences, seed=len(sequences))
    params = {**params, "window": 512}
    got, want = gemma_agrees(registry, on_card, "sliding_attention", operands, params, read=(3, 4, 10))
    np.testing.assert_array_equal(got[3], want[3])
    np.testing.assert_array_equal(got[4], want[4])


def test_gemma3_270m_on_the_card_gives_the_host_path_s_tokens(gemma3):
    """Greedy, TP 1: the same prompts on the card (every node on a device row) and on the host rows."""
    from test_gemma3 import greedy
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,"]
    on_device = greedy(gemma3, 1, prompts, 24, device="auto")
    on_host = greedy(gemma3, 1, prompts, 24, device="host")
    assert on_device == on_host
