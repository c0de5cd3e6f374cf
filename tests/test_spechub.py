"""spechub, the worked example (plugins/spechub), built with cmake out of tree: its host oracle
computes what spechub_math.h says (numpy's Philox, the first maximum, the draws), speculative
sampling through it gives the target's distribution, and its device rows run through the engine's
device path on the fake card (the source it carries compiled there, or, where nvcc is here, the
sm_90 cubin it carries) and agree with the oracle bit for bit."""

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

import early_builds
from conftest import build_spechub
from radiance.device.compile_cache import CompileCache
from radiance.device.fake import FakeDevice
from radiance.device.launch_rules import LaunchRuleError
from radiance.engine.loading.registry import Registry
from radiance.engine.running.device_stream import EngineStream
from radiance.engine.running.op_runner import OpRunner

spec = importlib.util.spec_from_file_location("spechub_fake", Path(__file__).parent / "fixtures" / "spechub_fake.py")
spechub_fake = importlib.util.module_from_spec(spec)
spec.loader.exec_module(spechub_fake)

VOCAB = 50


def build_spechub_sm_90() -> Path:
    """spechub built carrying its sm_90 cubin: the home."""
    return build_spechub(early_builds.folder() / "spechub-sm_90", "-DRAD_CUDA_ARCHS=90", "-DRAD_BUILD_TARGET_EXTRA=fake")


# The cubin's build (nvcc) begins when collection ends, beside the run (tests/early_builds.py); none
# without nvcc.
EARLY_BUILDS = {} if shutil.which("nvcc") is None else {"cmake:spechub-sm_90": build_spechub_sm_90}


@pytest.fixture(scope="module")
def registry(spechub_home):
    registry = Registry(str(spechub_home), kernels="spechub")
    assert registry.refused == []
    yield registry
    registry.close()


def spechub(registry):
    (library,) = [lib for lib in registry.hierarchy if lib.name == "spechub"]
    return library


def host_rows(registry):
    return {row.op: row for row in spechub(registry).rows if row.reference}


def runner(registry, op, device=None, **geometry):
    return OpRunner(registry, op, {"vocab": VOCAB, **geometry}, 1 << 15, accept_reference=device is None, device=device)


def propose(registry, logits, temperature, rng, device=None):
    rows = len(logits)
    tokens, probs = np.zeros(rows, np.int32), np.zeros((rows, VOCAB), np.float32)
    run = runner(registry, "mtp_couple_propose", device)
    run(rows, logits, temperature, rng, tokens, probs)
    run.close()
    return tokens, probs


def verify(registry, logits, drafts, probs, temperature, rng, device=None):
    rows, k = drafts.shape
    tokens, accepted = np.zeros((rows, k + 1), np.int32), np.zeros(rows, np.int32)
    run = runner(registry, "mtp_couple_verify", device, k=k)
    run(rows, logits, drafts, probs, temperature, rng, tokens, accepted)
    run.close()
    return tokens, accepted


def philox(seed, c0, c1, c2=0):
    return np.random.Generator(np.random.Philox(key=seed, counter=[c0, c1, c2, 0])).random()


def test_spechub_loads_as_the_specification_describes(registry):
    library = spechub(registry)
    assert registry.hierarchy[0] is library
    assert [(row.name, row.op, row.reference, row.info.domain) for row in library.rows] == [
        ("spechub_propose", "mtp_couple_propose", False, 2), ("spechub_verify", "mtp_couple_verify", False, 2),
        ("spechub_ref_propose", "mtp_couple_propose", True, 1), ("spechub_ref_verify", "mtp_couple_verify", True, 1)]
    assert library.info.build_target.split() == ["host", "cuda", "hip", "fake"]
    assert [schema.op for schema in library.schemas] == ["mtp_couple_propose", "mtp_couple_verify"]


def test_the_host_rows_are_the_reference_and_serve_only_when_asked(registry):
    from radiance.engine.selection.bands import SelectionError

    with pytest.raises(SelectionError, match="only the reference row spechub:spechub_ref_propose matches; serving "
                                             "from it needs --debug-accept-reference-kernels"):
        OpRunner(registry, "mtp_couple_propose", {"vocab": VOCAB}, 8)


def test_propose_takes_the_first_maximum_greedily_and_a_philox_draw_otherwise(registry):
    rng_ = np.random.default_rng(0)
    logits = rng_.normal(0, 2, (6, VOCAB)).astype(np.float32)
    logits[0, [3, 7]] = 9.0  # a tie: the first maximum
    temperature = np.array([0, 0.7, 1.0, 1.3, 0.5, 2.0], np.float32)
    rng = np.array([[11 + r, 40 + r] for r in range(6)], np.uint64)
    tokens, probs = propose(registry, logits, temperature, rng)
    assert tokens[0] == 3 and probs[0].tolist() == np.eye(VOCAB)[3].tolist()
    for r in range(1, 6):
        z = logits[r] / temperature[r]
        weights = np.exp(z.astype(np.float64) - np.float64(z.max()))
        np.testing.assert_allclose(probs[r], weights / weights.sum(), rtol=2e-6)
        u = philox(int(rng[r, 0]), int(rng[r, 1]), 1)
        assert tokens[r] == int(np.argmax(np.cumsum(weights) > u * weights.sum())), r


def test_verify_keeps_the_drafts_the_target_agrees_with_greedily(registry):
    k = 3
    logits = np.zeros((2 * (k + 1), VOCAB), np.float32)
    for row, best in enumerate([5, 6, 7, 8, 1, 2, 3, 4]):
        logits[row, best] = 1.0
    drafts = np.array([[5, 6, 9], [1, 2, 3]], np.int32)
    probs = np.zeros((2 * k, VOCAB), np.float32)
    tokens, accepted = verify(registry, logits, drafts, probs, np.zeros(2, np.float32), np.zeros((2, 2), np.uint64))
    assert accepted.tolist() == [3, 4]
    assert tokens.tolist() == [[5, 6, 7, -1], [1, 2, 3, 4]]


def test_speculative_sampling_gives_the_target_distribution(registry):
    """Each of many sequences drafts one token from q (propose) and verifies it against p: the first
    token given is distributed as p, and a draft is kept with probability sum(min(p, q))."""
    rows = 20000
    target = np.log(np.linspace(1, 6, VOCAB)).astype(np.float32)  # p, at temperature 1
    draft = np.log(np.linspace(6, 1, VOCAB) ** 2).astype(np.float32)  # q, far from p
    temperature = np.ones(rows, np.float32)
    rng = np.stack([np.arange(rows, dtype=np.uint64) + 7, np.full(rows, 3, np.uint64)], axis=1)
    drafts, q = propose(registry, np.tile(draft, (rows, 1)), temperature, rng)
    tokens, accepted = verify(registry, np.tile(target, (2 * rows, 1)), drafts[:, None], q, temperature, rng)
    p = np.exp(target.astype(np.float64)) / np.exp(target.astype(np.float64)).sum()
    q_exact = np.exp(draft.astype(np.float64)) / np.exp(draft.astype(np.float64)).sum()
    counts = np.bincount(tokens[:, 0], minlength=VOCAB)
    expected = p * rows
    chi2 = float((((counts - expected) ** 2) / expected).sum())
    assert chi2 < 110, chi2  # 49 degrees of freedom: p-value ~1e-6 at 110
    kept = (accepted == 2).mean()
    assert abs(kept - np.minimum(p, q_exact).sum()) < 0.015
    # a draft is rejected only where q_d > p_d, where the residual is 0: the token given is another
    assert ((accepted == 2) == (tokens[:, 0] == drafts)).all()
    assert (tokens[accepted == 1, 1] == -1).all() and (tokens[accepted == 2, 1] >= 0).all()


def _fake_card(registry, cache_folder, target="fake_90"):
    return FakeDevice(spechub_fake.kernels(host_rows(registry)), target=target, device_bytes=1 << 28,
                      cache=CompileCache(cache_folder))


def _cases(seed):
    rng_ = np.random.default_rng(seed)
    rows, k = 5, 3
    logits = rng_.normal(0, 3, (rows, VOCAB)).astype(np.float32)
    temperature = np.array([0, 0.8, 1.0, 1.5, 0.3], np.float32)
    rng = np.array([[100 + r, 7] for r in range(rows)], np.uint64)
    target = rng_.normal(0, 3, (rows * (k + 1), VOCAB)).astype(np.float32)
    return logits, temperature, rng, target, k


def test_the_device_rows_run_on_the_fake_card_and_agree_with_the_oracle(registry, tmp_path):
    logits, temperature, rng, target, k = _cases(1)
    device = _fake_card(registry, tmp_path)
    try:
        drafts, q = propose(registry, logits, temperature, rng, device=device)
        drafts_k = np.repeat(drafts[:, None], k, axis=1).astype(np.int32)
        q_k = np.repeat(q, k, axis=0)
        on_card = verify(registry, target, drafts_k, q_k, temperature, rng, device=device)
        names = [launch.name for launch in device.launches]
        assert names == ["spechub_propose", "spechub_verify"] and device.compiles == 1  # the source, once
    finally:
        device.close()
    assert (drafts.tolist(), q.tolist()) == tuple(x.tolist() for x in propose(registry, logits, temperature, rng))
    oracle = verify(registry, target, drafts_k, q_k, temperature, rng)
    assert [x.tolist() for x in on_card] == [x.tolist() for x in oracle]


def test_a_device_row_is_captured_into_a_graph_and_replays_new_contents(registry, tmp_path):
    """The launch a C device row issues through the RadStreamTable is recorded by a capture and
    replayed: the graph reads the operands' new contents, as a captured decode step does."""
    from radiance.abi import RAD_DT_F32, RAD_DT_I32, RAD_DT_U64, RadArgs, rad_device_tensor

    logits, temperature, rng, _, _ = _cases(2)
    device = _fake_card(registry, tmp_path)
    try:
        rows = len(logits)
        (row,) = [row for row in spechub(registry).rows if row.name == "spechub_propose"]
        stream = EngineStream(device)
        buffers = [device.alloc(a.nbytes, "x") for a in (logits, temperature, rng)]
        tokens, probs = device.alloc(rows * 4, "tokens"), device.alloc(rows * VOCAB * 4, "probs")
        for buffer, array in zip(buffers, (logits, temperature, rng)):
            device.copy_to_device(buffer, array)
        args = RadArgs(t=(rad_device_tensor(buffers[0].ptr, RAD_DT_F32, logits.shape, 4),
                          rad_device_tensor(buffers[1].ptr, RAD_DT_F32, (rows,), 4),
                          rad_device_tensor(buffers[2].ptr, RAD_DT_U64, (rows, 2), 8),
                          rad_device_tensor(tokens.ptr, RAD_DT_I32, (rows,), 4),
                          rad_device_tensor(probs.ptr, RAD_DT_F32, (rows, VOCAB), 4)),
                       params={"M": rows, "vocab": VOCAB}, stream=stream)
        device.begin_capture(stream.handle)
        assert row.info.launch(args) == 0
        graph = device.instantiate(device.end_capture(stream.handle))
        assert device.launches == []  # recorded, not run
        for shift in (0.0, 5.0):
            device.copy_to_device(buffers[0], logits + np.float32(shift) * np.eye(rows, VOCAB, dtype=np.float32))
            device.launch_graph(graph, stream.handle)
            out = np.zeros(rows, np.int32)
            device.copy_to_host(out, tokens)
            expected, _ = propose(registry, logits + np.float32(shift) * np.eye(rows, VOCAB, dtype=np.float32),
                                  temperature, rng)
            assert out.tolist() == expected.tolist()
        assert len(device.launches) == 2
    finally:
        device.close()


def test_a_failing_launch_is_reported_naming_the_kernel(registry, tmp_path):
    """The engine's launch rules hold for a C row's kernel: a launch the rules refuse is raised,
    one line naming the kernel, whatever status the row returns."""
    logits, temperature, rng, _, _ = _cases(3)
    device = _fake_card(registry, tmp_path)
    device.budget.launching = lambda kernel: (_ for _ in ()).throw(LaunchRuleError(f"kernel {kernel!r}: refused"))
    try:
        with pytest.raises(LaunchRuleError, match="kernel 'spechub_propose': refused"):
            propose(registry, logits, temperature, rng, device=device)
    finally:
        device.close()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH: no cubin to carry (CI machines "
                                                          "without the CUDA toolkit check the source path above)")
def test_the_sm_90_cubin_spechub_carries_is_the_code_object_a_sm_90_card_loads(registry, tmp_path):
    home = early_builds.result("cmake:spechub-sm_90", build_spechub_sm_90)
    cubin_registry = Registry(str(home), kernels="spechub")
    library = spechub(cubin_registry)
    assert library.info.build_target.split() == ["host", "sm_90", "cuda", "hip", "fake"]
    logits, temperature, rng, _, _ = _cases(4)
    device = _fake_card(cubin_registry, tmp_path / "cache", target="sm_90")
    try:
        tokens, probs = propose(cubin_registry, logits, temperature, rng, device=device)
        assert device.compiles == 0 and [launch.name for launch in device.launches] == ["spechub_propose"]
    finally:
        device.close()
        cubin_registry.close()
    assert tokens.tolist() == propose(registry, logits, temperature, rng)[0].tolist()
