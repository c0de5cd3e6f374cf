"""libr4d's device rows for Gemma 3's ops (device_gemma_rows.py: scale, rmsnorm_heads, gelu_tanh_mul in
device/gemma.cu; sliding_attention in device/attention_window.cu) without a card: registration, the
launch plans, the rows on a fake NVIDIA card whose kernels are numpy forms of their arithmetic
(tests/fixtures/r4d_fake_kernels.py) against libref within each row's tolerance, at Gemma 3 270M's
shapes (640 wide, 4 query heads over one kv head of 256, a window of 512), and the sources compiled
by nvcc for sm_90 (skipped, saying so, where nvcc is not installed). On a card:
test_device_gguf_card.py."""

import functools

import numpy as np
import pytest

from radiance.abi import RAD_DOMAIN_DEVICE, RAD_OK
from radiance.engine.running.device_stream import EngineStream
import early_builds
from device_batch_support import nvidia_fake
from device_sources import NVCC, sm_90_cubin
from test_device_rows_host import dev, ints, launch
from test_device_rows_support import Card
from test_device_tensor_cores import Recording, attention_operands
from test_libr4d_support import activations, plain_weight, registry, rel_err, row_of  # noqa: F401 (registry is a fixture)
from test_libr4d_support import launch as host_launch

OPS = {"scale": "r4dchain_scale_dev", "rmsnorm_heads": "r4dchain_rmsnorm_heads_dev",
       "gelu_tanh_mul": "r4dchain_gelu_tanh_mul_dev", "sliding_attention": "r4dchain_sliding_attention_dev"}

# nvcc's compiles begin when collection ends, beside the run (tests/early_builds.py); none without nvcc.
EARLY_BUILDS = {} if NVCC is None else {"nvcc:gemma": functools.partial(sm_90_cubin, "gemma"),
                                        "nvcc:attention_window_256_4": functools.partial(sm_90_cubin, "attention_window",
                                                                                         (256, 4))}


def module(registry, name):
    import importlib
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return importlib.import_module(f"{lib.module.__name__}.{name}")


def device_row(registry, name):
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    return next(row for row in lib.rows if row.name == name)


def test_each_gemma_op_has_a_chained_device_row(registry):
    for op, name in OPS.items():
        rows = [row for row in registry.rows_for(op) if row.info.domain == RAD_DOMAIN_DEVICE]
        assert [row.name for row in rows] == [name], op
    lib = next(lib for lib in registry.hierarchy if lib.name == "libr4d")
    assert all(lib.module.rad_kernel_chain(i) for i, row in enumerate(lib.rows) if row.name in OPS.values())


def test_sliding_attention_plans_the_store_then_the_window_kernel(registry):
    stream, row = Recording("sm_90"), device_row(registry, OPS["sliding_attention"])
    m, seqs, heads, kv, d = 12, 3, 4, 1, 256
    tensors = [dev(0x1000, (m, heads * d)), dev(0x2000, (m, kv * d)), dev(0x3000, (m, kv * d)),
               dev(0x4000, (512, kv * d)), dev(0x5000, (512, kv * d)), dev(0x6000, (m,), 3), dev(0x7000, (m,), 3),
               dev(0x8000, (seqs + 1,), 3), dev(0x9000, (seqs,), 3), dev(0xa000, (seqs, 32), 3), dev(0xb000, (m, heads * d))]
    params = {"M": m, "q_heads": heads, "kv_heads": kv, "head_dim": d, "block_size": 16, "window": 512, "scale": 0.0625,
              "dtype": "f32"}
    need = row.info.scratch({**params, "M": 256})
    assert launch(row, tensors, params, stream, 0x9000000, need) == RAD_OK
    assert [name for name, *_ in stream.launches] == ["r4d_kv_store_dev", "r4d_attend_window"]
    _, grid, block, args = stream.launches[1]
    dk = module(registry, "device_kernels")
    assert grid == (m, kv, dk.attention_splits(m, kv, 132)) and block == (256, 1, 1)
    assert stream.compiled[-1] == ("r4d_attend_window", dk.attention_options(d, heads // kv))
    assert ints(args, [14, 15, 16, 17, 18, 19, 20, 22]) == [seqs, 32, heads, kv, d, 16, 0, 512]
    assert launch(row, tensors, dict(params), stream, 0x9000000, 16) != RAD_OK  # too little scratch: an error code


@pytest.fixture(scope="module")
def on_fake():
    device = nvidia_fake("sm_90")
    card = Card(device, EngineStream(device))
    yield card
    card.close()
    device.close()


def agree(registry, on_fake, op, operands, params, read, weights=None):
    tolerance = module(registry, "device_gemma_rows").TOLERANCE[op]
    got = on_fake.run(device_row(registry, OPS[op]), operands, params, weights, read)
    arrays = [None if weights and i in weights else np.array(o, copy=True) for i, o in enumerate(operands)]
    assert host_launch(row_of(registry, op, "libref"), arrays, params, weights) == RAD_OK
    for i in read:
        if tolerance == 0.0:
            np.testing.assert_array_equal(got[i], arrays[i], err_msg=op)
        else:
            assert rel_err(got[i], arrays[i]) <= tolerance, (op, i, rel_err(got[i], arrays[i]))
    return got, arrays


@pytest.mark.parametrize("m", [1, 7, 40])
def test_scale_and_gelu_tanh_mul_agree_with_libref(registry, on_fake, m):
    x = activations(m, 640, m)
    agree(registry, on_fake, "scale", [x, np.zeros_like(x)], {"M": m, "n": 640, "scale": float(np.sqrt(640.0)),
                                                               "dtype": "f32"}, read=(1,))
    gate, up = activations(m, 2048, m + 1) * 2, activations(m, 2048, m + 2)
    agree(registry, on_fake, "gelu_tanh_mul", [gate, up, np.zeros_like(gate)], {"M": m, "n": 2048, "dtype": "f32"},
          read=(2,))


@pytest.mark.parametrize("m,heads", [(1, 4), (5, 1), (9, 4)])
def test_rmsnorm_heads_agrees_with_libref(registry, on_fake, m, heads):
    """q's 4 heads and k's one of 256 (Gemma 3 270M), the weight a 1 + w multiplier."""
    x = activations(m, heads * 256, heads)
    w = plain_weight(1.0 + np.random.default_rng(3).standard_normal((1, 256)).astype(np.float32) * 0.1, "f32")
    agree(registry, on_fake, "rmsnorm_heads", [x, None, np.zeros_like(x)],
          {"M": m, "heads": heads, "head_dim": 256, "eps": 1e-6, "dtype": "f32"}, read=(2,), weights={1: w})


SLIDING = {
    # decode tokens, some past the window (whose oldest keys drop out), some inside it
    "decode": (4, 1, 256, 16, [(p, 1) for p in (3, 15, 16, 17, 40, 100, 255)]),
    # a prefill chunk crossing the window's edge beside a decode token
    "chunk": (4, 1, 256, 32, [(20, 30), (70, 1)]),
    # two kv heads of two query heads each, a window of one key
    "window_one": (4, 2, 64, 1, [(0, 5), (9, 1)]),
}


@pytest.mark.parametrize("case", sorted(SLIDING))
def test_sliding_attention_agrees_with_libref(registry, on_fake, case):
    heads, kv, d, window, sequences = SLIDING[case]
    operands, params = attention_operands(heads, kv, d, sequences, seed=len(case))
    params = {**params, "window": window}
    got, want = agree(registry, on_fake, "sliding_attention", operands, params, read=(3, 4, 10))
    np.testing.assert_array_equal(got[3], want[3])  # the step's k, v stored at their slots
    np.testing.assert_array_equal(got[4], want[4])
    full = [np.array(o, copy=True) for o in operands]
    assert host_launch(row_of(registry, "attention", "libref"), full, params) == RAD_OK
    assert rel_err(got[10], full[10]) > 1e-3  # the window matters in every case


def test_the_sources_compile_for_sm_90_with_nvcc():
    """gemma.cu, and attention_window.cu at Gemma's head_dim 256 and 4 query heads a kv head, as the
    engine puts them together (common.cu first; attention.cu before the window's entry)."""
    if NVCC is None:
        pytest.skip("nvcc is not on PATH: the CUDA sources cannot be compiled here")
    for key, entries in (("nvcc:gemma", ("r4d_scale_dev", "r4d_rmsnorm_heads_dev", "r4d_gelu_tanh_mul_dev")),
                         ("nvcc:attention_window_256_4", ("r4d_attend_window", "r4d_kv_store_dev"))):
        result, cubin = early_builds.result(key, EARLY_BUILDS[key])
        assert result.returncode == 0, result.stderr[-2000:]
        assert all(entry.encode() in cubin.read_bytes() for entry in entries), key


def test_gemma3_270m_resolves_wholly_to_libr4d_device_rows(gemma3):
    """The real Q4_K_M file (q5_0, q4_k, q6_k and q8_0 weights; Gemma's four ops) on an NVIDIA card at
    TP 1: every node of every band is one of libr4d's device rows, no reference row accepted (the
    tokens themselves need a real card: test_device_gguf_card.py)."""
    from radiance.config import Config
    from radiance.engine.loading.registry import Registry
    from radiance.ranks.worker import Worker
    config = Config(model=str(gemma3), radiance_home="", kernels="libr4d,libref", progress=False, max_context=128)
    registry, device = Registry(radiance_home="", kernels="libr4d,libref"), nvidia_fake("sm_90")
    worker = Worker(config, device=device, registry=registry).build()
    try:
        rows = {launch.band.row.name: launch.band.row for launch, _, _ in worker.graph.issued()}
    finally:
        worker.close()
        device.close()
        registry.close()
    assert all(row.plugin.name == "libr4d" and row.info.domain == RAD_DOMAIN_DEVICE for row in rows.values()), rows
    assert {"r4dchain_gemv_q5_0_dev", "r4dchain_gemv_q4_k_dev", "r4dchain_gemv_q6_k_dev", "r4dchain_gemm_q4_k_dev",
            *OPS.values()} <= set(rows)
