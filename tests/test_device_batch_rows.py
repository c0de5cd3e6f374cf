"""libr4d's device rows for batches on a real card against libref (device_batch_rows.py): the
tensor-core gemm above the GEMV band, bf16 and fp8, each kernel the card can run (forced by
device_tensor_cores.KERNEL; on Hopper gemm_tma.cu in each of its cuts too), and the streamed GEMM of batched decode in several cuts
(device_streamed_gemm.SERVING set); the fp8 decode GEMV and its fused rows. The
tolerances are docs/OPS.md's ("Agreement with libref"): device_tensor_cores.TOLERANCE and
device_kernels.TOLERANCE. A prefill-sized M is checked on a sample of its rows (libref's ordered
sums over all 2048 would take minutes on the host; the rows of a GEMM are independent). Skips where no
card is visible. Without a card: tests/test_device_tensor_cores.py runs the same rows on the fake card."""

import numpy as np
import pytest

from radiance.plugins.kernels.libr4d.device_tensor_cores import CUTS, TMA_CUTS
from test_device_rows_support import Card, card
from device_batch_support import fp8_weight
from test_libr4d_support import activations, launch, make_weight, registry, rel_err, row_of  # noqa: F401

DEVICE, STREAM, WHY = card()
pytestmark = pytest.mark.skipif(DEVICE is None, reason=f"device rows need a card: {WHY}")
BF16, FP8 = "r4dchain_gemm_tc_bf16_dev", "r4dchain_gemm_tc_fp8_dev"
# (N, K): Llama-3-8B's q/o, k/v, gate/up, down at TP 1 and SmolLM2-135M's q, gate, down
SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (576, 576), (1536, 576), (576, 1536)]


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


def kernels_here(registry, kind="bf16") -> list:
    """The tensor-core kernels this card runs for `kind`: the one it is given first, and on Hopper
    (given wgmma) mma.sync's as well, which it runs too, and for bf16 the TMA kernel it is given
    from device_tensor_cores.TMA_FROM rows and the skinny kernel it is given above the GEMV band."""
    tc = module(registry, "device_tensor_cores")
    given = tc.kernel_for(DEVICE.vendor, DEVICE.target, kind)
    if given != "wgmma":
        return [given]
    above = [tc.kernel_for(DEVICE.vendor, DEVICE.target, kind, m) for m in (tc.TMA_FROM, tc.GEMV_MAX_M + 1)]
    return [given, "mma"] + [kernel for kernel in ("tma", "skinny") if kernel in above]


_WEIGHTS: dict = {}


def weight_of(registry, fmt, n, k, seed):
    key = (fmt, n, k, seed)
    if key not in _WEIGHTS:
        _WEIGHTS[key] = (make_weight("bf16", n, k, seed) if fmt == "bf16"
                         else fp8_weight(registry, n, k, seed, "channel" if fmt == "fp8_channel" else "tensor"))
    return _WEIGHTS[key]


def reference_rows(registry, x, weight, params, rows):
    """libref's gemm of x's rows `rows` only."""
    sub = np.ascontiguousarray(x[rows])
    want = np.zeros((len(rows), params["N"]), np.float32)
    assert launch(row_of(registry, "gemm", "libref"), [sub, None, want], {**params, "M": len(rows)}, {1: weight}) == 0
    return want


def gemm_case(registry, on_card, monkeypatch, kernel, fmt, n, k, m, seed=3, kind=None):
    """The row against libref within the tolerance of `kind` (the weights' kind unless given)."""
    tc = module(registry, "device_tensor_cores")
    monkeypatch.setattr(tc, "KERNEL", kernel)
    weight, x = weight_of(registry, fmt, n, k, seed), activations(m, k, seed + m)
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    row = dev_row(registry, BF16 if fmt == "bf16" else FP8)
    got = on_card.run(row, [x, None, np.zeros((m, n), np.float32)], params, {1: weight}, read=(2,))[2]
    rows = np.arange(m) if m <= 80 else np.unique(np.r_[0:8, m // 2 - 4:m // 2 + 4, m - 8:m])
    err = rel_err(got[rows], reference_rows(registry, x, weight, params, rows))
    assert np.isfinite(got).all()
    assert err <= tc.TOLERANCE[kind or ("bf16" if fmt == "bf16" else "e4m3")], (kernel, fmt, n, k, m, err)
    return got


@pytest.fixture
def tile_gemms(registry, monkeypatch):
    """The tile kernels at every M: the streamed GEMM (by default the rows' kernel at M <= 32) set aside."""
    monkeypatch.setattr(module(registry, "device_streamed_gemm"), "SERVING", None)


@pytest.mark.usefixtures("tile_gemms")
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", [9, 16, 64, 65, 300])
def test_the_bf16_tensor_core_gemm_agrees_with_libref(registry, on_card, monkeypatch, n, k, m):
    for kernel in kernels_here(registry):
        gemm_case(registry, on_card, monkeypatch, kernel, "bf16", n, k, m)


@pytest.mark.usefixtures("tile_gemms")
@pytest.mark.parametrize("fmt", ["fp8_channel", "fp8"])
@pytest.mark.parametrize("n,k", SHAPES[:4])
@pytest.mark.parametrize("m", [9, 64, 300])
def test_the_fp8_tensor_core_gemm_agrees_with_libref(registry, on_card, monkeypatch, fmt, n, k, m):
    for kernel in kernels_here(registry, "e4m3"):
        gemm_case(registry, on_card, monkeypatch, kernel, fmt, n, k, m)


@pytest.mark.usefixtures("tile_gemms")
def test_a_prefill_sized_gemm_and_its_kernels_agree(registry, on_card, monkeypatch):
    """M = 2048 (a 2048-token prompt in one step): each kernel within the tolerance of libref on
    sampled rows, and the kernels within twice the tolerance of each other everywhere."""
    results = [gemm_case(registry, on_card, monkeypatch, kernel, "bf16", 4096, 4096, 2048)
               for kernel in kernels_here(registry)]
    tc = module(registry, "device_tensor_cores")
    for other in results[1:]:
        assert rel_err(other, results[0]) <= 2 * tc.TOLERANCE["bf16"]


@pytest.mark.usefixtures("tile_gemms")
@pytest.mark.parametrize("cut", [str(cut) for cut in CUTS])
@pytest.mark.parametrize("fmt,n,k,m", [("bf16", 4096, 4096, 300), ("bf16", 576, 1536, 65), ("bf16", 1024, 4096, 9),
                                       ("fp8_channel", 14336, 4096, 300), ("fp8", 4096, 14336, 64)])
def test_every_wgmma_cut_agrees_with_libref(registry, on_card, monkeypatch, cut, fmt, n, k, m):
    """Each cut bench/card_prefill_gemm.py --cuts all times (device_tensor_cores.CUTS), on Hopper:
    tails in M and N, split K (M 9 and 65), bf16 and both fp8 scalings."""
    tc = module(registry, "device_tensor_cores")
    if tc.kernel_for(DEVICE.vendor, DEVICE.target, "bf16" if fmt == "bf16" else "e4m3") != "wgmma":
        pytest.skip(f"{DEVICE.target} runs no wgmma")
    monkeypatch.setattr(tc, "WGMMA_CUT", tc.WgmmaCut.parse(cut))
    gemm_case(registry, on_card, monkeypatch, "wgmma", fmt, n, k, m)


@pytest.mark.usefixtures("tile_gemms")
@pytest.mark.parametrize("cut", [str(cut) for cut in TMA_CUTS])
@pytest.mark.parametrize("fmt,n,k,m", [("bf16", 4096, 4096, 300), ("bf16", 576, 1536, 65),
                                       ("bf16", 1024, 4096, 9), ("fp8_channel", 14336, 4096, 300),
                                       ("fp8", 4096, 14336, 64)])
def test_every_tma_cut_agrees_with_libref(registry, on_card, monkeypatch, cut, fmt, n, k, m):
    """gemm_tma.cu (R4D_TC_KERNEL=tma) in each cut device_tensor_cores.TMA_CUTS offers, on Hopper:
    its tensor maps built on the card, M, N and K tails through TMA's zero fill, split K (M 9, 64
    and 65), bf16 and both fp8 scalings (a prefill's M: the tests above, with R4D_TC_KERNEL=tma)."""
    tc = module(registry, "device_tensor_cores")
    if DEVICE.vendor != "cuda" or tc.sm_of(DEVICE.target) != 90:
        pytest.skip(f"{DEVICE.target} is no Hopper: no TMA and wgmma")
    monkeypatch.setattr(tc, "TMA_CUT", tc.TmaCut.parse(cut))
    gemm_case(registry, on_card, monkeypatch, "tma", fmt, n, k, m)


@pytest.mark.usefixtures("tile_gemms")
@pytest.mark.parametrize("fmt", ["bf16", "fp8_channel"])
def test_a_split_gemm_gives_the_same_bits_launch_after_launch(registry, on_card, monkeypatch, fmt):
    tc = module(registry, "device_tensor_cores")
    kind = "bf16" if fmt == "bf16" else "e4m3"
    for kernel in kernels_here(registry, kind):
        monkeypatch.setattr(tc, "KERNEL", kernel)
        row = dev_row(registry, BF16 if fmt == "bf16" else FP8)
        params = {"M": 12, "N": 1024, "K": 4096, "wdtype": fmt, "dtype": "f32", "split_k": 1}
        operands = [activations(12, 4096, 5), None, np.zeros((12, 1024), np.float32)]
        a = on_card.args(row, operands, params, {1: weight_of(registry, fmt, 1024, 4096, 9)})
        assert tc.split(12, 1024, 4096, kind, kernel)[0] > 1
        on_card.replays_agree(row, a, 2, operands[2])


# ---- the streamed GEMM of batched decode (gemm_streamed.cu), serving every M <= 64 here -------------------------

STREAMED = [("bf16", 4096, 4096, 9), ("bf16", 1024, 4096, 32), ("bf16", 14336, 4096, 64), ("bf16", 4096, 14336, 33),
            ("bf16", 576, 1536, 17), ("fp8_channel", 4096, 4096, 64), ("fp8", 1024, 4096, 16),
            ("fp8_channel", 4096, 14336, 32)]


def streamed_case(registry, on_card, monkeypatch, cut, fmt, n, k, m):
    sg, tc = module(registry, "device_streamed_gemm"), module(registry, "device_tensor_cores")
    kind = "bf16" if fmt == "bf16" else "e4m3"
    kernel = tc.kernel_for(DEVICE.vendor, DEVICE.target, kind)
    monkeypatch.setattr(sg, "SERVING", sg.Serving(sg.StreamedCut.parse(cut)))
    if not sg.serves(kernel, kind, m):
        pytest.skip(f"{DEVICE.target}: no streamed GEMM for {kind} ({kernel})")
    # x is only rounded to bf16 for both kinds: bf16's tolerance for fp8 weights too
    return gemm_case(registry, on_card, monkeypatch, kernel, fmt, n, k, m, kind="bf16")


@pytest.mark.parametrize("fmt,n,k,m", STREAMED)
def test_the_streamed_gemm_agrees_with_libref(registry, on_card, monkeypatch, fmt, n, k, m):
    """Llama-3-8B's shapes and SmolLM2's, M in each of the three entries, split K, bf16 and both fp8
    scalings, in the default cut."""
    streamed_case(registry, on_card, monkeypatch, "1", fmt, n, k, m)


@pytest.mark.parametrize("cut", ["8,2,128,2", "8,2,64,1,2", "2,1,64,1"])
@pytest.mark.parametrize("fmt,n,k,m", [STREAMED[1], STREAMED[6]])
def test_other_streamed_cuts_agree_with_libref(registry, on_card, monkeypatch, cut, fmt, n, k, m):
    streamed_case(registry, on_card, monkeypatch, cut, fmt, n, k, m)


def test_a_split_streamed_gemm_gives_the_same_bits_launch_after_launch(registry, on_card, monkeypatch):
    sg, tc = module(registry, "device_streamed_gemm"), module(registry, "device_tensor_cores")
    monkeypatch.setattr(sg, "SERVING", sg.Serving(sg.StreamedCut()))
    if not sg.serves(tc.kernel_for(DEVICE.vendor, DEVICE.target, "bf16"), "bf16", 24):
        pytest.skip(f"{DEVICE.target}: no streamed GEMM")
    row = dev_row(registry, BF16)
    params = {"M": 24, "N": 1024, "K": 4096, "wdtype": "bf16", "dtype": "f32", "split_k": 1}
    operands = [activations(24, 4096, 5), None, np.zeros((24, 1024), np.float32)]
    a = on_card.args(row, operands, params, {1: weight_of(registry, "bf16", 1024, 4096, 9)})
    assert sg.split(24, 1024, 4096, "bf16", sg.SERVING.cut)[0] > 1
    on_card.replays_agree(row, a, 2, operands[2])


# ---- fp8 decode: the GEMV and its fused rows ------------------------------------------------------

@pytest.mark.parametrize("fmt", ["fp8_channel", "fp8"])
@pytest.mark.parametrize("n,k", [(4096, 4096), (1024, 4096), (4096, 14336), (576, 576)])
@pytest.mark.parametrize("m", [1, 4, 8])
def test_the_fp8_gemv_agrees_with_libref(registry, on_card, fmt, n, k, m):
    dk = module(registry, "device_kernels")
    weight, x = weight_of(registry, fmt, n, k, 7), activations(m, k, 8)
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    got = on_card.run(dev_row(registry, "r4dchain_gemv_fp8_dev"), [x, None, np.zeros((m, n), np.float32)], params,
                      {1: weight}, read=(2,))[2]
    want = reference_rows(registry, x, weight, params, np.arange(m))
    assert rel_err(got, want) <= dk.TOLERANCE["gemv"], rel_err(got, want)


@pytest.mark.parametrize("m", [1, 3])
def test_the_fp8_fused_rows_agree_with_libref_s_chains(registry, on_card, m):
    dk = module(registry, "device_kernels")
    hidden, ffn = 4096, 14336
    x, norm = activations(m, hidden, 31), make_weight("f32", 1, hidden, 32)
    zeros = lambda n: np.zeros((m, n), np.float32)  # noqa: E731
    weights = {1: norm, 3: weight_of(registry, "fp8_channel", 4096, hidden, 33),
               5: weight_of(registry, "fp8_channel", 1024, hidden, 34), 7: weight_of(registry, "fp8_channel", 1024, hidden, 35)}
    params = {"M": m, "n": hidden, "eps": 1e-5, "K": hidden, "N.1": 4096, "N.2": 1024, "N.3": 1024,
              "wdtype": "fp8_channel", "dtype": "f32"}
    operands = [x, None, zeros(hidden), None, zeros(4096), None, zeros(1024), None, zeros(1024)]
    got = on_card.run(dev_row(registry, "r4dchain_rmsnorm_gemm3_fp8_dev"), operands, params, weights, read=(2, 4, 6, 8))
    want = {i: np.array(o, copy=True) if o is not None else None for i, o in enumerate(operands)}
    arrays = [None if i in weights else want[i] for i in range(len(operands))]
    assert launch(row_of(registry, "rmsnorm_gemm3", "libref"), arrays, params, weights) == 0
    assert rel_err(got[2], arrays[2]) <= dk.TOLERANCE["rmsnorm"]
    for i in (4, 6, 8):
        assert rel_err(got[i], arrays[i]) <= dk.TOLERANCE["gemv"], i
    residual = activations(m, hidden, 36)
    weight = weight_of(registry, "fp8_channel", hidden, ffn, 37)
    params = {"M": m, "N": hidden, "K": ffn, "n": hidden, "wdtype": "fp8_channel", "dtype": "f32"}
    operands = [activations(m, ffn, 38), None, zeros(hidden), residual]
    got = on_card.run(dev_row(registry, "r4dchain_gemm_add_fp8_dev"), operands, params, {1: weight}, read=(2, 3))
    arrays = [operands[0], None, zeros(hidden), residual.copy()]
    assert launch(row_of(registry, "gemm_add", "libref"), arrays, params, {1: weight}) == 0
    for i in (2, 3):
        assert rel_err(got[i], arrays[i]) <= dk.TOLERANCE["gemv"], i


# ---- attention for batches: the tiles on tensor cores ------------------------------------------------

def attention_against_libref(registry, on_card, heads, kv, d, sequences, seed=0, block_size=16, tolerance=None):
    from test_device_tensor_cores import attention_operands
    at = module(registry, "device_attention_tiles")
    operands, params = attention_operands(heads, kv, d, sequences, block_size=block_size, seed=seed)
    got = on_card.run(dev_row(registry, "r4dchain_attention_tc_dev"), operands, params, read=(3, 4, 10))
    arrays = [np.array(o, copy=True) for o in operands]
    assert launch(row_of(registry, "attention", "libref"), arrays, params) == 0
    np.testing.assert_array_equal(got[3], arrays[3])
    np.testing.assert_array_equal(got[4], arrays[4])
    err = rel_err(got[10], arrays[10])
    assert np.isfinite(got[10]).all() and err <= (tolerance or at.TOLERANCE), err
    return got[10]


def test_attention_decodes_32_sequences_of_mixed_contexts_to_8k(registry, on_card):
    rng = np.random.default_rng(32)
    contexts = np.unique(np.r_[1, 2, 15, 16, 17, 8191, rng.integers(1, 8192, 40)])[:32]
    attention_against_libref(registry, on_card, 32, 8, 128, [(int(c) - 1, 1) for c in contexts], seed=1)


def test_attention_decodes_64_sequences(registry, on_card):
    rng = np.random.default_rng(64)
    attention_against_libref(registry, on_card, 32, 8, 128, [(int(c), 1) for c in rng.integers(0, 2048, 64)], seed=2)


def test_attention_runs_a_prefill_chunk_beside_decode_tokens(registry, on_card):
    """Chunked prefill: 256 new tokens of a sequence with 1000 cached, and 7 decode tokens."""
    attention_against_libref(registry, on_card, 32, 8, 128, [(1000, 256), *((p, 1) for p in (5, 99, 700, 3000, 17, 40, 8000))],
                             seed=3)


def test_attention_prefills_smollm2_shapes(registry, on_card):
    attention_against_libref(registry, on_card, 9, 3, 64, [(0, 100), (0, 13), (40, 30)], seed=4)


# ---- decode steps: attention_decode.cu (f32: held to the attention rows' 2e-5, not the tiles' bf16 tolerance)

DECODE_CONTEXTS = {"one": [1], "seventeen": [17], "1k": [1024], "8191": [8191],
                   "mixed": [1, 2, 15, 16, 17, 64, 129, 1000, 1024, 4097, 8191]}


# (batch, contexts): 8191 and mixed at batch 8 only (the operands' random caches and libref's host sums
# grow with batch x the longest context; test_attention_decodes_32_sequences_of_mixed_contexts_to_8k
# takes 32 to 8k)
DECODE_CASES = [(batch, contexts) for batch in (1, 8, 33, 64) for contexts in sorted(DECODE_CONTEXTS)
                if batch == 8 or contexts not in ("8191", "mixed")]


@pytest.mark.parametrize("batch,contexts", DECODE_CASES)
def test_decode_attention_agrees_with_libref(registry, on_card, batch, contexts):
    """A decode step of `batch` sequences, their contexts cycling through the list."""
    dk = module(registry, "device_kernels")
    picks = DECODE_CONTEXTS[contexts]
    sequences = [(picks[i % len(picks)] - 1, 1) for i in range(batch)]
    attention_against_libref(registry, on_card, 32, 8, 128, sequences, seed=batch, tolerance=dk.TOLERANCE["attention"])


@pytest.mark.parametrize("block_size,heads,kv,d", [(32, 32, 8, 128), (16, 9, 3, 64), (1, 8, 8, 64)])
def test_decode_attention_takes_other_blocks_and_heads(registry, on_card, block_size, heads, kv, d):
    dk = module(registry, "device_kernels")
    sequences = [(p, 1) for p in (0, 16, 31, 32, 500, 2047, 3000, 77, 9)]
    attention_against_libref(registry, on_card, heads, kv, d, sequences, seed=block_size, block_size=block_size,
                             tolerance=dk.TOLERANCE["attention"])


def test_a_split_decode_gives_the_same_bits_launch_after_launch(registry, on_card):
    from test_device_tensor_cores import attention_operands
    operands, params = attention_operands(32, 8, 128, [(p, 1) for p in (4000, 8000, 100, 1)], seed=5)
    row = dev_row(registry, "r4dchain_attention_tc_dev")
    on_card.replays_agree(row, on_card.args(row, operands, params), 10, operands[10])


# ---- attention_tiles.cu's cuts (device_attention_tiles.CUTS; bench/card_prefill_attention.py --cuts) ----

# (q heads, kv heads, head_dim, sequences): a prompt of 8-warp tiles whose length is no multiple of 32
# or 48 keys; SmolLM2's heads (group 3, head_dim 64); a chunk after 500 cached keys (the f32 cache's
# path, 8 warps) beside decode tokens
CUT_CASES = [(32, 8, 128, [(0, 300)]), (9, 3, 64, [(0, 100), (0, 13), (40, 30)]), (32, 8, 128, [(500, 200), (5, 1), (99, 1)])]


@pytest.mark.parametrize("case", range(len(CUT_CASES)))
def test_every_attention_cut_agrees_with_libref_and_the_default_kernel(registry, on_card, monkeypatch, case):
    """Each cut (device_attention_tiles.CUTS) against libref (the row's tolerance, libref run once) and
    against the default cut's rows (3e-3: the same roundings, other tiles of the online softmax); lazy 1
    against lazy 0 of its keys bit for bit."""
    from test_device_tensor_cores import attention_operands
    at = module(registry, "device_attention_tiles")
    heads, kv, d, sequences = CUT_CASES[case]
    operands, params = attention_operands(heads, kv, d, sequences, seed=case)
    want = [np.array(o, copy=True) for o in operands]
    assert launch(row_of(registry, "attention", "libref"), want, params) == 0
    rows = {}
    for cut in at.CUTS:  # a fresh params object a cut: its own plan (device_rows' plan key)
        monkeypatch.setattr(at, "CUT", cut)
        got = on_card.run(dev_row(registry, "r4dchain_attention_tc_dev"), operands, dict(params), read=(3, 4, 10))
        np.testing.assert_array_equal(got[3], want[3])
        np.testing.assert_array_equal(got[4], want[4])
        rows[cut] = got[10]
        assert np.isfinite(got[10]).all() and rel_err(got[10], want[10]) <= at.TOLERANCE, (cut, rel_err(got[10], want[10]))
        assert rel_err(got[10], rows[at.CUTS[0]]) <= 3e-3, (cut, rel_err(got[10], rows[at.CUTS[0]]))
        if cut.lazy:
            np.testing.assert_array_equal(got[10], rows[at.Cut(cut.keys, 0)], err_msg=str(cut))
