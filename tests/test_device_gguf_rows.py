"""libr4d's device rows for the GGUF block types (device_gguf_rows.py, device/gemv_gguf.cu) without a
card: the rows the device selection takes for each type, the launch plans (entry, grid, the format's
entries alone compiled), the rows on a fake NVIDIA card whose kernels are numpy forms of the kernel's
arithmetic (tests/fixtures/r4d_fake_kernels.py) against libref within the GEMV tolerance, on random
GGUF blocks as the converter imports them and on Gemma 3 270M's shapes, and the source compiled by
nvcc for sm_90 (skipped, saying so, where nvcc is not installed). On a card: test_device_gguf_card.py."""

import functools

import numpy as np
import pytest

from radiance.abi import RAD_DOMAIN_DEVICE, RAD_DT_ENCODED, RAD_OK, RadTensor, RadWeightPlanes, rad_device_tensor
from radiance.engine.running.device_stream import EngineStream
from radiance.engine.selection.bands import resolve
import early_builds
from device_batch_support import nvidia_fake
from device_sources import NVCC, sm_90_cubin
from test_device_rows_host import dev, ints, launch, pointers
from test_device_rows_support import Card
from test_device_tensor_cores import Recording
from test_libr4d_kquants import TYPES, gguf_weight
from test_libr4d_support import activations, registry, rel_err, row_of  # noqa: F401 (registry is a fixture)
from test_libr4d_support import launch as host_launch

NAMES = [qtype.name.lower() for qtype in TYPES]
# Gemma 3 270M's GGUF-typed linear weights (N, K): q, gate, up (q5_0), o (q4_k), down (q6_k), k (q5_0)
GEMMA = [("q5_0", 1024, 640), ("q5_0", 2048, 640), ("q4_k", 640, 1024), ("q6_k", 640, 2048), ("q5_0", 256, 640)]

# nvcc's compile begins when collection ends, beside the run (tests/early_builds.py); none without nvcc.
EARLY_BUILDS = {} if NVCC is None else {"nvcc:gemv_gguf": functools.partial(sm_90_cubin, "gemv_gguf")}


def module(registry, name):
    import importlib
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return importlib.import_module(f"{lib.module.__name__}.{name}")


def device_row(registry, name):
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return next(row for row in lib.rows if row.name == name)


def weight_of(fmt, n, k, seed):
    qtype = next(q for q in TYPES if q.name.lower() == fmt)
    return gguf_weight(qtype, n, k, seed)[0]


def on_card_weight(weight, base):
    planes = [rad_device_tensor(base + 0x100000 * i, 6, (np.asarray(t.data).nbytes,), 1)
              for i, t in enumerate(weight.planes)]
    device = RadWeightPlanes(encoding=weight.encoding, rows=weight.rows, cols=weight.cols, planes=planes)
    return RadTensor(data=device, dtype=RAD_DT_ENCODED, ndim=2, shape=(weight.rows, weight.cols, 0, 0))


@pytest.mark.parametrize("fmt", NAMES)
def test_the_device_selection_takes_the_gguf_rows_for_both_bands(registry, fmt):
    block = 256 if fmt.endswith("_k") else 32
    geometry = {"N": 4096, "K": 4096, "wdtype": fmt, "dtype": "f32"}
    chosen = resolve("gemm", registry.ops["gemm"].schema, registry.rows_for("gemm"), geometry, {}, RAD_DOMAIN_DEVICE, 512)
    assert [(b.lo, b.hi, b.row.name) for b in chosen.bands] == [
        (1, 8, f"r4dchain_gemv_{fmt}_dev"), (9, 512, f"r4dchain_gemm_{fmt}_dev")]
    row = device_row(registry, f"r4dchain_gemv_{fmt}_dev")
    weight = weight_of(fmt, 8, block * 2, 1)
    from radiance.abi import RAD_E_DTYPE, RAD_E_SHAPE, RAD_E_UNSUPPORTED
    assert row.info.layout("w", weight.encoding, {"K": block * 2}) == RAD_E_UNSUPPORTED  # read as stored
    assert row.info.layout("w", weight.encoding, {"K": block * 2 + 16}) == RAD_E_SHAPE
    other = weight_of("q4_0" if fmt != "q4_0" else "q6_k", 8, 512, 1)
    assert row.info.layout("w", other.encoding, {"K": 512}) == RAD_E_DTYPE


@pytest.mark.parametrize("m,entry,chunks", [(1, "m1", 1), (3, "m4", 1), (8, "m8", 1), (9, "m8", 2), (37, "m8", 5)])
def test_a_plan_is_one_launch_of_the_format_s_entry_over_chunks_of_m(registry, m, entry, chunks):
    rows = module(registry, "device_gguf_rows")
    stream, weight = Recording("sm_90"), on_card_weight(weight_of("q4_k", 1000, 512, 2), 0x7000000)
    name = f"r4dchain_{'gemv' if m <= 8 else 'gemm'}_q4_k_dev"
    x, y = dev(0x1000, (m, 512)), dev(0x2000, (m, 1000))
    params = {"M": m, "N": 1000, "K": 512, "wdtype": "q4_k", "dtype": "f32", "split_k": 1}
    assert launch(device_row(registry, name), [x, weight, y], params, stream) == RAD_OK
    ((kernel, grid, block, args),) = stream.launches
    assert kernel == f"r4d_kq_gemv_q4_k_{entry}" and grid == (125, 1, chunks) and block == (128, 1, 1)
    assert stream.compiled == [(kernel, ("-DR4D_KQ_ONLY=6", f"-DKQ_WARPS={rows.WARPS}", f"-DKQ_ROWS={rows.ROWS}"))]
    assert ints(args, [1, 2, 9]) == [m, 512, 1000]
    # codes, scale, scale.1, min, min.1 in the kernel's order, whatever order the encoding lists them in
    planes = {spec.name: 0x7000000 + 0x100000 * i for i, spec in enumerate(weight.data.encoding.planes)}
    assert pointers(args, [0, 3, 4, 5, 6, 7, 8]) == [0x1000, planes["codes"], planes["scale"], planes["scale.1"],
                                                     planes["min"], planes["min.1"], 0x2000]
    assert launch(device_row(registry, name), [x, weight, y], params, stream) == RAD_OK
    assert len(stream.compiled) == 1 and len(stream.launches) == 2  # the plan is replayed


@pytest.fixture(scope="module")
def on_fake():
    device = nvidia_fake("sm_90")
    card = Card(device, EngineStream(device))
    yield card
    card.close()
    device.close()


def agree(registry, on_fake, weight, m, seed):
    fmt, n, k = module(registry, "rows_kquants").encoding_format(weight.encoding), weight.rows, weight.cols
    name = f"r4dchain_{'gemv' if m <= 8 else 'gemm'}_{fmt}_dev"
    params = {"M": m, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1}
    x = activations(m, k, seed)
    before = len(on_fake.device.launches)
    got = on_fake.run(device_row(registry, name), [x, None, np.full((m, n), np.nan, np.float32)], params, {1: weight},
                      read=(2,))[2]
    assert [launch.name for launch in on_fake.device.launches[before:]] == [
        f"r4d_kq_gemv_{fmt}_m{module(registry, 'device_kernels').gemv_variant(min(m, 8))}"]
    want = np.zeros((m, n), np.float32)
    assert host_launch(row_of(registry, "gemm", "libref"), [x, None, want], params, {1: weight}) == RAD_OK
    err = rel_err(got, want)
    assert np.isfinite(got).all() and err <= module(registry, "device_kernels").TOLERANCE["gemv"], (name, err)
    return err


@pytest.mark.parametrize("fmt", NAMES)
@pytest.mark.parametrize("m", [1, 3, 8, 20])
def test_the_rows_agree_with_libref_on_the_fake_card(registry, on_fake, fmt, m):
    """Random blocks (any code, any sub-block scale and minimum, small f16 fields): 21 output rows, so
    the last block's warps run past N."""
    agree(registry, on_fake, weight_of(fmt, 21, 512 if fmt.endswith("_k") else 576, 5), m, seed=m)


@pytest.mark.parametrize("fmt,n,k", GEMMA, ids=[f"{f}_{n}x{k}" for f, n, k in GEMMA])
def test_gemma3_270m_shapes_agree_with_libref_on_the_fake_card(registry, on_fake, fmt, n, k):
    weight = weight_of(fmt, n, k, n + k)
    for m in (1, 12):
        agree(registry, on_fake, weight, m, seed=m)


def embedding_agrees(registry, card, fmt, vocab, n, m=40):
    """libref's rows bit for bit (every value the core decoder's)."""
    weight = weight_of(fmt, vocab, n, vocab)
    ids = np.random.default_rng(vocab).integers(0, vocab, m).astype(np.int32)
    ids[:2] = [0, vocab - 1]
    params = {"M": m, "n": n, "vocab": vocab, "wdtype": fmt, "dtype": "f32"}
    row = device_row(registry, "r4dchain_embedding_gguf_dev")
    got = card.run(row, [ids, None, np.zeros((m, n), np.float32)], params, {1: weight}, read=(2,))[2]
    want = np.zeros((m, n), np.float32)
    assert host_launch(row_of(registry, "embedding", "libref"), [ids, None, want], params, {1: weight}) == RAD_OK
    np.testing.assert_array_equal(got, want, err_msg=fmt)
    if hasattr(card.device, "launches"):  # the fake card records what ran
        assert card.device.launches[-1].name == f"r4d_kq_embedding_{fmt}"


@pytest.mark.parametrize("fmt", NAMES)
def test_the_embedding_row_is_libref_s_bit_for_bit_on_the_fake_card(registry, on_fake, fmt):
    embedding_agrees(registry, on_fake, fmt, 50, 512)


def test_the_source_compiles_for_sm_90_with_nvcc():
    """Every format's entries, as the engine puts the source together (common.cu first); nvrtc
    compiles the same text on a card."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH: the CUDA source cannot be compiled here")
    result, path = early_builds.result("nvcc:gemv_gguf", EARLY_BUILDS["nvcc:gemv_gguf"])
    assert result.returncode == 0, result.stderr[-2000:]
    cubin = path.read_bytes()
    assert all(f"r4d_kq_gemv_{fmt}_m{mt}".encode() in cubin for fmt in NAMES for mt in (1, 2, 4, 8))
    assert all(f"r4d_kq_embedding_{fmt}".encode() in cubin for fmt in NAMES)
