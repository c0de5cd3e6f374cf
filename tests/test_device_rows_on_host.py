"""The new device sources themselves, run without a card: gemv_gguf.cu, gemma.cu, elementwise.cu's add,
silu_mul and rope, attention_tiles.cu (its bf16 MMAs, ldmatrix and copies in tests/fixtures/tensor_core_on_host.h's
host forms), and attention_window.cu (after attention.cu, whose fused rope + attention kernel is
checked here too), their real text built with g++ behind tests/fixtures/cuda_on_host.h (fibers for
a block's lanes, a warp's shuffles and barriers emulated) as the kernels of a fake NVIDIA card, the
rows launched through their plans, against libref within each row's tolerance. What the numpy forms
(test_device_gguf_rows.py, test_device_gemma_rows.py) cannot show: the kernels' own indexing, bit
extraction, sub-block scales and split merges. Skipped, saying so, where g++ is missing."""

from pathlib import Path

import numpy as np
import pytest

from radiance.abi import RAD_DT_F32, RAD_OK, rad_device_tensor
from radiance.engine.running.device_stream import EngineStream
from device_batch_support import fixture_module, nvidia_fake
from test_device_rows_support import Card
from test_attention_tiles_on_host import host_source as attention_tiles_host_source
from test_device_tensor_cores import attention_operands
from test_libr4d_kquants import TYPES, gguf_weight
from test_libr4d_support import activations, make_weight, plain_weight, registry, rel_err, row_of  # noqa: F401 (registry)
from test_libr4d_support import launch as host_launch

FIXTURES = Path(__file__).parent / "fixtures"
ON_HOST = fixture_module("cuda_on_host")
pytestmark = pytest.mark.skipif(ON_HOST.why() is not None, reason=str(ON_HOST.why()))
NAMES = [qtype.name.lower() for qtype in TYPES]


def module(registry, name):
    import importlib
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return importlib.import_module(f"{lib.module.__name__}.{name}")


def device_row(registry, name):
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return next(row for row in lib.rows if row.name == name)


@pytest.fixture(scope="module")
def on_host(registry):
    dk = module(registry, "device_kernels")

    def attention_options(launch):  # an r4d_attend_* kernel's head_dim and heads a kv head are its arguments
        if not launch.name.startswith("r4d_attend_"):
            return ()
        q_heads, kv_heads, d = (int.from_bytes(launch.args.data[launch.args.offsets[i]:launch.args.offsets[i] + 4],
                                               "little") for i in (16, 17, 18))
        return dk.attention_options(d, q_heads // kv_heads)

    def tiles_options(launch):  # head_dim from the launch's shared bytes, heads a kv head from its arguments
        at = module(registry, "device_attention_tiles")
        if launch.name != "r4d_attend_tiles":  # the store: no option of the tiles' changes it
            return ()
        q_heads, kv_heads = (int.from_bytes(launch.args.data[launch.args.offsets[i]:launch.args.offsets[i] + 4],
                                            "little") for i in (12, 13))
        d = next(d for d in at.HEAD_DIMS if at.shared_bytes(d) == launch.shared_bytes)
        return at.options(d, q_heads // kv_heads, launch.block[0] // 32)

    def decode_options(launch):  # head_dim and heads a kv head are r4d_attend_decode*'s arguments
        ad = module(registry, "device_attention_decode")
        q_heads, kv_heads, d = (int.from_bytes(launch.args.data[launch.args.offsets[i]:launch.args.offsets[i] + 4],
                                               "little") for i in (13, 14, 15))
        return ad.options(d, q_heads // kv_heads)

    kernels = {**ON_HOST.kernels(dk.source("gemv_gguf")), **ON_HOST.kernels(dk.source("gemma")),
               **ON_HOST.kernels(dk.source("attention_decode"), decode_options),
               **ON_HOST.kernels(dk.source("elementwise")),
               **ON_HOST.kernels(dk.source("attention_window"), attention_options),
               **ON_HOST.kernels(attention_tiles_host_source(), tiles_options)}
    device = nvidia_fake("sm_90", kernels)
    card = Card(device, EngineStream(device))
    yield card
    card.close()
    device.close()


def gemm_agrees(registry, on_host, weight, fmt, m):
    n, k = weight.rows, weight.cols
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    x = activations(m, k, m)
    name = f"r4dchain_{'gemv' if m <= 8 else 'gemm'}_{fmt}_dev"
    got = on_host.run(device_row(registry, name), [x, None, np.full((m, n), np.nan, np.float32)], params, {1: weight},
                      read=(2,))[2]
    want = np.zeros((m, n), np.float32)
    assert host_launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == RAD_OK
    err = rel_err(got, want)
    assert np.isfinite(got).all() and err <= module(registry, "device_kernels").TOLERANCE["gemv"], (name, err)


@pytest.mark.parametrize("fmt", NAMES)
def test_gemv_gguf_cu_agrees_with_libref(registry, on_host, fmt):
    """Random blocks, 19 output rows (the last block's warps past N), K of several lane rounds, the
    decode entries and the prefill's chunks of 8."""
    qtype = next(q for q in TYPES if q.name.lower() == fmt)
    weight = gguf_weight(qtype, 19, 1280 if fmt.endswith("_k") else 1088, seed=7)[0]
    for m in (1, 2, 5, 8, 11):
        gemm_agrees(registry, on_host, weight, fmt, m)


@pytest.mark.parametrize("fmt,n,k", [("q5_0", 256, 640), ("q4_k", 64, 1024), ("q6_k", 64, 2048)])
def test_gemv_gguf_cu_at_gemma3_270m_widths(registry, on_host, fmt, n, k):
    qtype = next(q for q in TYPES if q.name.lower() == fmt)
    gemm_agrees(registry, on_host, gguf_weight(qtype, n, k, seed=n)[0], fmt, 1)


@pytest.mark.parametrize("fmt", NAMES)
def test_the_embedding_entries_are_libref_s_bit_for_bit(registry, on_host, fmt):
    from test_device_gguf_rows import embedding_agrees
    embedding_agrees(registry, on_host, fmt, 12, 512, m=5)


def gemma_agrees(registry, on_host, op, operands, params, read, weights=None):
    tolerance = module(registry, "device_gemma_rows").TOLERANCE[op]
    got = on_host.run(device_row(registry, f"r4dchain_{op}_dev"), operands, params, weights, read)
    arrays = [None if weights and i in weights else np.array(o, copy=True) for i, o in enumerate(operands)]
    assert host_launch(row_of(registry, op, "libref"), arrays, params, weights) == RAD_OK
    for i in read:
        if tolerance == 0.0:
            np.testing.assert_array_equal(got[i], arrays[i], err_msg=op)
        else:
            assert rel_err(got[i], arrays[i]) <= tolerance, (op, i, rel_err(got[i], arrays[i]))
    return got, arrays


def test_gemma_cu_agrees_with_libref(registry, on_host):
    x = activations(3, 640, 1)
    gemma_agrees(registry, on_host, "scale", [x, np.zeros_like(x)],
                 {"M": 3, "n": 640, "scale": float(np.sqrt(640.0)), "dtype": "f32"}, read=(1,))
    gate, up = activations(2, 1000, 2) * 2, activations(2, 1000, 3)
    gemma_agrees(registry, on_host, "gelu_tanh_mul", [gate, up, np.zeros_like(gate)], {"M": 2, "n": 1000, "dtype": "f32"},
                 read=(2,))
    w = plain_weight(1.0 + np.random.default_rng(3).standard_normal((1, 256)).astype(np.float32) * 0.1, "f32")
    for heads in (4, 1):
        q = activations(3, heads * 256, heads)
        gemma_agrees(registry, on_host, "rmsnorm_heads", [q, None, np.zeros_like(q)],
                     {"M": 3, "heads": heads, "head_dim": 256, "eps": 1e-6, "dtype": "f32"}, read=(2,), weights={1: w})


@pytest.mark.parametrize("heads,kv,d,window,sequences", [
    (4, 1, 256, 16, [(3, 1), (20, 1), (40, 1)]),   # decode: inside the window and past it
    (4, 2, 64, 8, [(5, 6), (30, 1)]),              # a prefill chunk crossing the window's edge
])
def test_attention_window_cu_agrees_with_libref(registry, on_host, heads, kv, d, window, sequences):
    operands, params = attention_operands(heads, kv, d, sequences, seed=window)
    params = {**params, "window": window}
    got, want = gemma_agrees(registry, on_host, "sliding_attention", operands, params, read=(3, 4, 10))
    np.testing.assert_array_equal(got[3], want[3])
    np.testing.assert_array_equal(got[4], want[4])



@pytest.mark.parametrize("heads,kv,d,interleaved,sequences", [
    (8, 2, 128, 0, [(40, 1), (3, 1), (300, 1)]),   # decode: one token a sequence, k stored by each group's last block
    (9, 3, 64, 1, [(5, 6), (30, 1)]),              # a prefill chunk beside a decode token: the grid's last group rotates k
    (8, 1, 128, 0, [(2000, 1)]),                   # 8 query heads a kv head, 32 splits of two tiles each
    (9, 3, 64, 1, [(5, 1), (0, 1), (77, 1)]),       # decode, interleaved pairs, a first token (one key)
    (8, 2, 128, 0, [(p, 1) for p in (2000, 1, 129, 16, 700, 3000, 31, 64)]),  # batch 8 of mixed contexts
])
@pytest.mark.parametrize("decode_kernel", [False, True])
def test_rope_attention_cu_agrees_with_libref(registry, on_host, monkeypatch, heads, kv, d, interleaved, sequences,
                                              decode_kernel):
    """attention.cu's fused rope + store + attention (r4d_attend_fresh), and for decode steps of 2 or more
    sequences attention_decode.cu's r4d_attend_decode_rope where `decode_kernel`: q, k and the cache left as
    rope and the attention row leave them, bit for bit, and the output within attention's tolerance."""
    ad = module(registry, "device_attention_decode")
    monkeypatch.setattr(ad, "ENABLED", decode_kernel)
    before = len(on_host.device.launches)
    rope_attention_agrees(registry, on_host, heads, kv, d, sequences, d + len(sequences), 10000.0, interleaved)
    decode = all(count == 1 for _, count in sequences) and len(sequences) >= ad.BAND_FROM
    ran = [launch.name for launch in on_host.device.launches[before:]]
    assert ran == (["r4d_attend_decode_rope"] if decode_kernel and decode else ["r4d_attend_fresh"]), ran


@pytest.mark.parametrize("splits,sequences", [
    (1, [(700, 1), (33, 1)]), (3, [(700, 1), (33, 1)]), (32, [(700, 1), (33, 1), (0, 1)]),
    (32, [(29, 6), (40, 1)]),   # a chunk's keys 29..34 across the first tile's edge: both splits read them
])
def test_rope_attention_cu_agrees_at_every_split_count(registry, on_host, monkeypatch, splits, sequences):
    """R4D_ATT_SPLITS' cuts (device_kernels.ATT_SPLITS): one split writing out directly, three of
    several tiles each, and 32 of one tile (some sequences taking fewer; one at position 0), the
    merging block's first splits copied into shared memory, the rest loaded; a decode token's k and
    v stored by the block that holds its key; this step's keys read by every split that holds them."""
    monkeypatch.setattr(module(registry, "device_kernels"), "ATT_SPLITS", splits)
    monkeypatch.setattr(module(registry, "device_attention_decode"), "ENABLED", False)  # attention.cu's splits
    rope_attention_agrees(registry, on_host, 8, 2, 128, sequences, splits + len(sequences), 500000.0, 0)


def test_attention_cu_s_counters_outlive_other_steps_in_one_scratch(registry, on_host):
    """The engine gives the fused row one scratch for every step: a decode step of one sequence (32
    splits: partials over the scratch's start), then an 8-token chunk of the 8B shape, whose k the
    grid's last group rotates (a counter past the 64 of its tokens' groups), then a decode step of 3
    sequences on attention_decode.cu (its partials in the tail), then the chunk again. Each launch
    agrees with libref (q, k and the cache bit for bit): the counters, in the scratch's tail, are zero
    at every start (beside the partials, the chunk's grid counter lay in the first step's partials)."""
    from radiance.abi import RadArgs
    row = device_row(registry, "r4dchain_rope_attention_dev")
    inv_freq = (1.0 / 500000.0 ** (np.arange(0, 128, 2, dtype=np.float64) / 128)).astype(np.float32)
    size = row.info.scratch({"M": 8, "q_heads": 32, "kv_heads": 8, "head_dim": 128})
    scratch = on_host.alloc(size, "scratch")
    on_host.device.memset32(scratch, 0, size // 4, on_host.stream.handle)
    for i, sequences in enumerate([[(700, 1)], [(60, 8)], [(300, 1), (5, 1), (90, 1)], [(60, 8)]]):
        operands, params = attention_operands(32, 8, 128, sequences, seed=70 + i)
        q, k, v, k_cache, v_cache, slots, positions, cu, lengths, blocks, out = operands
        fused = [q, k, positions, inv_freq, v, k_cache, v_cache, slots, cu, lengths, blocks, out]
        params = {key: value for key, value in params.items() if key != "seqs"} | {"interleaved": 0}
        a = on_host.args(row, fused, params)
        a = RadArgs(t=a.t, params=a.params, scratch=scratch, scratch_bytes=size, stream=a.stream)
        assert row.info.launch(a) == RAD_OK
        want = [np.array(o, copy=True) for o in fused]
        assert host_launch(row_of(registry, "rope_attention", "libref"), want, params, None) == RAD_OK
        for j in (0, 1, 5, 6):
            np.testing.assert_array_equal(on_host.download(a.t[j], fused[j]), want[j], err_msg=f"step {i} operand {j}")
        got = on_host.download(a.t[11], fused[11])
        assert rel_err(got, want[11]) <= module(registry, "device_kernels").TOLERANCE["attention"], (i, rel_err(got, want[11]))


def rope_attention_agrees(registry, on_host, heads, kv, d, sequences, seed, theta, interleaved):
    """attention.cu's fused rope + store + attention on the host model against libref's rope_attention:
    q, k and the cache bit for bit, the output within attention's tolerance."""
    operands, params = attention_operands(heads, kv, d, sequences, seed=seed)
    q, k, v, k_cache, v_cache, slots, positions, cu, lengths, blocks, out = operands
    inv_freq = (1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)).astype(np.float32)
    fused = [q, k, positions, inv_freq, v, k_cache, v_cache, slots, cu, lengths, blocks, out]
    params = {key: value for key, value in params.items() if key != "seqs"} | {"interleaved": interleaved}
    read = (0, 1, 5, 6, 11)
    got = on_host.run(device_row(registry, "r4dchain_rope_attention_dev"), fused, params, None, read)
    want = [np.array(o, copy=True) for o in fused]
    assert host_launch(row_of(registry, "rope_attention", "libref"), want, params, None) == RAD_OK
    for i in (0, 1, 5, 6):
        np.testing.assert_array_equal(got[i], want[i], err_msg=f"operand {i}")
    tolerance = module(registry, "device_kernels").TOLERANCE["attention"]
    assert rel_err(got[11], want[11]) <= tolerance, rel_err(got[11], want[11])


def shifted(card, array, offset):
    """`array` on the card at `offset` bytes past a 16-byte boundary (an operand the float4 steps refuse)."""
    flat = np.ascontiguousarray(array, np.float32).reshape(-1)
    padded = card.upload(np.concatenate([np.zeros(offset // 4, np.float32), flat]))
    return rad_device_tensor(padded.data + offset, RAD_DT_F32, array.shape, 4)


@pytest.mark.parametrize("m,n,offset", [(3, 1024, 0), (5, 1001, 0), (2, 640, 4)])
def test_elementwise_cu_add_and_silu_mul_agree_with_libref(registry, on_host, m, n, offset):
    """add bit for bit, silu_mul within its tolerance: float4 steps where the three operands are
    16-byte aligned (a count of a multiple of 4, and one whose last values go one at a time), the
    scalar loop where one is not."""
    gate, up = activations(m, n, 1) * 2, activations(m, n, 2)
    params = {"M": m, "n": n, "dtype": "f32"}
    for op in ("add", "silu_mul"):
        got = on_host.run(device_row(registry, f"r4dchain_{op}_dev"),
                          [shifted(on_host, gate, offset), up, np.full((m, n), np.nan, np.float32)], params, read=(2,))[2]
        want = np.zeros((m, n), np.float32)
        assert host_launch(row_of(registry, op, "libref"), [gate, up, want], params) == RAD_OK
        tolerance = module(registry, "device_kernels").TOLERANCE[op]
        assert np.isfinite(got).all() and rel_err(got, want) <= tolerance, (op, rel_err(got, want))
        if tolerance == 0.0:
            np.testing.assert_array_equal(got, want, err_msg=op)


@pytest.mark.parametrize("m,n,offset", [(9, 1024, 0), (13, 1001, 0), (10, 640, 4)])
def test_elementwise_cu_add_rmsnorm_is_the_device_chain_bit_for_bit(registry, on_host, m, n, offset):
    """The fused residual add + rmsnorm above the decode band: the residual and the normed rows the
    same bits as the device rows' add then rmsnorm (the residual libref's bits too; the norm within
    rmsnorm's tolerance of libref's, its sum of squares in another order); float4 steps where
    aligned, one at a time where n is odd or x sits 4 bytes past a 16-byte boundary; rows past M
    untouched (the last norm block's warps past M)."""
    rows = m + 2
    residual, x = activations(rows, n, 21) * 3, activations(rows, n, 22)
    weight = plain_weight((1.0 + 0.1 * np.random.default_rng(23).standard_normal((1, n))).astype(np.float32), "f32")
    params = {"M": m, "n": n, "eps": 1e-5, "dtype": "f32"}
    y = np.full((rows, n), 3.0, np.float32)
    row = device_row(registry, "r4dchain_add_rmsnorm_dev")
    got = on_host.run(row, [residual, shifted(on_host, x, offset), None, y], params, {2: weight}, read=(0, 3))
    want = [residual.copy(), x, None, y.copy()]
    assert host_launch(row_of(registry, "add_rmsnorm", "libref"), want, params, {2: weight}) == RAD_OK
    np.testing.assert_array_equal(got[0], want[0])
    tolerance = module(registry, "device_kernels").TOLERANCE["rmsnorm"]
    assert rel_err(got[3][:m], want[3][:m]) <= tolerance, rel_err(got[3][:m], want[3][:m])
    chain = on_host.run(device_row(registry, "r4dchain_add_dev"), [residual[:m], x[:m], np.zeros((m, n), np.float32)],
                        {"M": m, "n": n, "dtype": "f32"}, read=(2,))[2]
    normed = on_host.run(device_row(registry, "r4dchain_rmsnorm_dev"), [chain, None, np.zeros((m, n), np.float32)],
                         params, {1: weight}, read=(2,))[2]
    np.testing.assert_array_equal(got[0][:m], chain)
    np.testing.assert_array_equal(got[3][:m], normed)
    np.testing.assert_array_equal(got[0][m:], residual[m:])
    assert (got[3][m:] == 3.0).all() and not np.array_equal(got[0][:m], residual[:m])


@pytest.mark.parametrize("m,n", [(260, 4096), (33, 102)])
def test_elementwise_cu_add_rmsnorm_is_the_add_then_the_norm(registry, on_host, m, n):
    """r4d_add_rmsnorm_dev (the add + rmsnorm row above the GEMV band), built from elementwise.cu: the
    residual r4d_add_dev's bits and y r4d_rmsnorm_dev's, both built from elementwise.cu; rows of 4096
    (the float4 loads r4d_add_rmsnorm_bf16_dev shares, a lane's batches whole) and of 102 (not a
    multiple of 4: the scalar loop). 260 rows: a tail in the last block's warps."""
    residual, x = activations(m, n, 21), activations(m, n, 22)
    weight = make_weight("f32", 1, n, 23)
    params = {"M": m, "n": n, "eps": 1e-5, "dtype": "f32"}
    got = on_host.run(device_row(registry, "r4dchain_add_rmsnorm_dev"), [residual.copy(), x, None, np.zeros((m, n), np.float32)],
                      params, {2: weight}, read=(0, 3))
    summed = on_host.run(device_row(registry, "r4dchain_add_dev"), [residual, x, np.zeros((m, n), np.float32)],
                         {"M": m, "n": n, "dtype": "f32"}, read=(2,))[2]
    normed = on_host.run(device_row(registry, "r4dchain_rmsnorm_dev"), [summed, None, np.zeros((m, n), np.float32)],
                         params, {1: weight}, read=(2,))[2]
    assert not np.array_equal(summed, residual)
    np.testing.assert_array_equal(got[0].view(np.uint32), summed.view(np.uint32))
    np.testing.assert_array_equal(got[3].view(np.uint32), normed.view(np.uint32))


@pytest.mark.parametrize("add", [False, True])
def test_elementwise_cu_add_rmsnorm_bf16_is_the_chain_and_its_rows_feed_the_grouped_gemm(registry, on_host,
                                                                                        monkeypatch, add):
    """The fused prefill rows' norm, r4d_add_rmsnorm_bf16_dev, built from elementwise.cu, in the row's
    Hopper launch (the maps and the grouped GEMM the fake card's numpy forms, which read x's bf16 rows
    from the scratch the kernel writes): the residual r4d_add_dev's bits and `normed` r4d_rmsnorm_dev's,
    both built from elementwise.cu, and q, k, v the same bits as with the kernel's numpy form (the
    rows: `normed` rounded to bf16, nearest even). 260 rows: a tail in the last norm block and tile."""
    from test_prefill_rows import launched, qkv_case, with_add

    monkeypatch.delenv("R4D_PREFILL_FUSED", raising=False)
    case = qkv_case(260, norm_format="f32")
    case = with_add(case) if add else case
    got, names = launched(on_host, registry, case)
    assert names[0] == "r4d_add_rmsnorm_bf16_dev" and names[-1] == "r4d_tma_gemm_bf16_group", names
    fake = nvidia_fake("sm_90")
    card = Card(fake, EngineStream(fake))
    try:
        numpy_form, _ = launched(card, registry, case)
    finally:
        card.close()
        fake.close()
    for i in case[5]:
        np.testing.assert_array_equal(got[i].view(np.uint32), numpy_form[i].view(np.uint32), err_msg=f"operand {i}")
    operands, weights = case[2], case[4]
    m, n = operands[0].shape
    residual = operands[0]
    if add:  # the chain's add, then its norm of the sum
        residual = on_host.run(device_row(registry, "r4dchain_add_dev"), [operands[0], operands[1], np.zeros((m, n), np.float32)],
                               {"M": m, "n": n, "dtype": "f32"}, read=(2,))[2]
        np.testing.assert_array_equal(got[0], residual)
    normed = on_host.run(device_row(registry, "r4dchain_rmsnorm_dev"), [residual, None, np.zeros((m, n), np.float32)],
                         {"M": m, "n": n, "eps": 1e-5, "dtype": "f32"}, {1: weights[2 if add else 1]}, read=(2,))[2]
    np.testing.assert_array_equal(got[3 if add else 2], normed)


@pytest.mark.parametrize("heads,kv,d,interleaved,m", [(32, 8, 128, 0, 3), (9, 3, 64, 1, 2), (2, 1, 1024, 0, 1),
                                                      (2, 1, 2048, 1, 2), (3, 1, 2056, 0, 1), (4, 2, 6, 0, 2)])
def test_elementwise_cu_rope_agrees_with_libref(registry, on_host, heads, kv, d, interleaved, m):
    """A block a token: its angles once into shared memory (head_dim 2048 and 2056: more pairs than a
    chunk of 512), then every (head, pair): float4 steps where q and k are 16-byte aligned and d
    allows (head_dim 6: its 3 pairs go one at a time), the same bits as the scalar loop, which q
    placed 4 bytes past a 16-byte boundary takes."""
    q, k = activations(m, heads * d, 5), activations(m, kv * d, 6)
    positions = np.random.default_rng(7).integers(0, 8192, m).astype(np.int32)
    inv_freq = (1.0 / 500000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d)).astype(np.float32)
    params = {"M": m, "q_heads": heads, "kv_heads": kv, "head_dim": d, "interleaved": interleaved, "dtype": "f32"}
    row = device_row(registry, "r4dchain_rope_dev")
    got = on_host.run(row, [q, k, positions, inv_freq], params, read=(0, 1))
    want = [np.array(o, copy=True) for o in (q, k, positions, inv_freq)]
    assert host_launch(row_of(registry, "rope", "libref"), want, params) == RAD_OK
    tolerance = module(registry, "device_kernels").TOLERANCE["rope"]
    for i in (0, 1):
        assert rel_err(got[i], want[i]) <= tolerance, (i, rel_err(got[i], want[i]))
    moved = shifted(on_host, q, 4)
    scalar = on_host.run(row, [moved, k, positions, inv_freq], params, read=(1,))
    np.testing.assert_array_equal(on_host.download(moved, q), got[0])
    np.testing.assert_array_equal(scalar[1], got[1])


def test_attention_tiles_cu_agrees_with_libref(registry, on_host):
    """attention_tiles.cu's own indexing, slot lookups, copies, rounding, barriers and split merges, its
    bf16 MMAs and ldmatrix in their host form: the row on the host against libref within its tolerance. One
    sequence's chunk of 20 tokens after 1500 cached (its tiles taken last first; 16 splits of 3 key
    tiles each); 32 blocks, the host's threads being slow."""
    at = module(registry, "device_attention_tiles")
    operands, params = attention_operands(4, 1, 128, [(1500, 20)], seed=5)
    got = on_host.run(device_row(registry, "r4dchain_attention_tc_dev"), operands, params, read=(3, 4, 10))
    want = [np.array(o, copy=True) for o in operands]
    assert host_launch(row_of(registry, "attention", "libref"), want, params) == RAD_OK
    np.testing.assert_array_equal(got[3], want[3])
    np.testing.assert_array_equal(got[4], want[4])
    assert np.isfinite(got[10]).all() and 0 < rel_err(got[10], want[10]) <= at.TOLERANCE, rel_err(got[10], want[10])


def test_attention_tiles_cu_s_48_key_cut_runs_through_the_row_s_plan(registry, on_host, monkeypatch):
    """device_attention_tiles.CUT set between plans reaches the launch (48 keys: 52,224 bytes of shared
    memory, its own build) and agrees with libref and with the default cut: 40 tokens after 40 cached
    (8-warp tiles; 16 splits of which most see no key, their partials empty)."""
    at = module(registry, "device_attention_tiles")
    operands, params = attention_operands(4, 1, 128, [(40, 40)], seed=6)
    row = device_row(registry, "r4dchain_attention_tc_dev")
    default = on_host.run(row, operands, params, read=(10,))[10]
    monkeypatch.setattr(at, "CUT", at.Cut(48, 1))
    assert at.shared_bytes(128) == 52224
    got = on_host.run(row, operands, params, read=(10,))[10]
    want = [np.array(o, copy=True) for o in operands]
    assert host_launch(row_of(registry, "attention", "libref"), want, params) == RAD_OK
    assert np.isfinite(got).all() and 0 < rel_err(got, want[10]) <= at.TOLERANCE, rel_err(got, want[10])
    assert 0 < rel_err(got, default) <= 3e-3
