"""The fused prefill rows (device_prefill_rows.py) in a whole prefill of a synthetic bf16 llama, in
process on a fake sm_90 (tests/device_batch_support.py's NvidiaFake): the resolution
and --debug-selection's report take them above the band (the first layer's norm without an add, every
later chain with the residual add, the last layer's add alone, nothing else in the graph changed), and
the prefill's residual stream `h` and greedy tokens are the same bits with the grouped launches
(R4D_PREFILL_FUSED unset), with the chain's own (R4D_PREFILL_FUSED=0) and without fusions at all.

libr4d serves add, rmsnorm, gemm and silu_mul and its fused rows over them, whose kernels the fake card
runs in numpy (tests/fixtures/r4d_fake_kernels.py, fakecard.py's r4d_add_dev and r4d_rmsnorm_dev);
the fixture library fakedev serves the rest (embedding, rope + attention, take_rows, sample) with
libref's arithmetic. The model's K (128) is one TMA pass, so the chain's GEMMs sum K unsplit and the
contract is bitwise (docs/OPS.md, add_rmsnorm_gemm3)."""

import numpy as np
import pytest

from device_batch_support import fixture_module, nvidia_fake
from test_device_executor import FIXTURE, fused_chains

SHAPE = dict(hidden=128, layers=2, heads=4, kv_heads=2, ffn=256, vocab=512, context=512)
KERNELS = "fakedev,libr4d,libref"
LENGTHS = (300, 40)  # one step of 340 rows: above TMA_FROM (256), a prompt's tail in the last row tile
ROWS = {"rmsnorm_gemm3": "r4dchain_rmsnorm_gemm3_tc_dev", "ffn": "r4dchain_add_rmsnorm_gemm2_silu_mul_tc_dev",
        "qkv": "r4dchain_add_rmsnorm_gemm3_tc_dev"}
PLAIN_FFN = "r4dchain_rmsnorm_gemm2_silu_mul_tc_dev"  # the first layer's, were no add before its norm


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    from radiance.convert.api import convert_synthetic

    path = tmp_path_factory.mktemp("prefill-rows") / "llama_bf16.rad"
    convert_synthetic(path, "llama", SHAPE, seed=5)  # linear weights bf16 by default
    return path


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> str:
    """fakedev built for cuda (so it loads on the NVIDIA fakes), leaving libr4d the ops the prefill rows
    fuse, and offering the sampler's and attention's fused ops (so libr4d's, whose kernels have no
    fake form here, are not taken)."""
    root = tmp_path_factory.mktemp("prefill-rows-home")
    (root / "kernels").mkdir()
    chains = fused_chains()
    offered = {op: chains[op] for op in ("take_rows_rmsnorm_gemm_sample", "rope_attention")}
    source = FIXTURE.read_text()
    for old, new in (('BUILD_TARGET = "fake"', 'BUILD_TARGET = "cuda"'),
                     ("LEAVE = ()", 'LEAVE = ("add", "rmsnorm", "gemm", "silu_mul")'),
                     ("REPLACES = {}", f"REPLACES = {offered!r}")):
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    (root / "kernels" / "fakedev.py").write_text(source)
    return str(root)


def built(model, home, target, fusion=True, prefill_rows=True):
    """(config, registry, fake card, worker); prefill_rows=False: libr4d without device_prefill_rows' rows."""
    from radiance.config import Config
    from radiance.engine.loading.registry import Registry
    from radiance.ranks.worker import Worker

    config = Config(model=str(model), radiance_home=home, kernels=KERNELS, progress=False, max_seqs=2,
                    max_context=512, max_step_tokens=512, fusion=fusion, accept_reference=True, device="host")
    registry = Registry(radiance_home=home, kernels=KERNELS)
    if not prefill_rows:
        libr4d = next(library for library in registry.hierarchy if library.name == "libr4d")
        kept = [row for row in libr4d.rows if row.name not in set(ROWS.values()) | {PLAIN_FFN}]
        assert len(libr4d.rows) - len(kept) == 4
        libr4d.rows = kept
    device = nvidia_fake(target, fixture_module("fakecard").kernels())
    return config, registry, device, Worker(config, device=device, registry=registry).build()


def prefill(model, home, target, fusion=True) -> dict:
    """One step prefilling both prompts: their greedy tokens, `h` after it, the step's rows and the
    fake card's launches by kernel name."""
    from radiance.generation.engine import Engine
    from radiance.generation.sequence import SamplingParams
    from radiance.generation.text import TextCodec

    config, registry, device, worker = built(model, home, target, fusion)
    try:
        container = worker.model.container
        engine = Engine(config, worker.execute, TextCodec(container.tokenizer, container.chat_template,
                                                          worker.model.hyper))
        prompts = [[int(i) for i in np.random.default_rng(seed).integers(3, SHAPE["vocab"], length)]
                   for seed, length in enumerate(LENGTHS)]
        sequences = [engine.add(p, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)) for p in prompts]
        engine.step()
        assert all(s.finished for s in sequences)
        return {"tokens": [s.output_ids for s in sequences], "h": worker.executor.read_buffer("h", sum(LENGTHS)),
                "rows": [launch.band.row.name for launch in worker.graph.launches(sum(LENGTHS), len(LENGTHS))],
                "kernels": [launch.name for launch in device.launches]}
    finally:
        worker.close()
        device.close()
        registry.close()


def test_the_resolution_takes_the_prefill_rows_above_the_band_and_changes_nothing_else(bf16_model, home):
    """At 340 rows: layer 0's norm + q, k, v (no add precedes it), then every add + norm + GEMMs the
    fused row with the add, the last layer's down projection's add alone (take_rows follows, not a
    norm); the other rows those of the unfused graph. At 255 rows the chain (add_rmsnorm's row)."""
    _, registry, device, worker = built(bf16_model, home, "sm_90")
    try:
        above = [launch.band.row.name for launch in worker.graph.launches(sum(LENGTHS), 2)]
        below = [launch.band.row.name for launch in worker.graph.launches(255, 1)]
        report = "\n".join(worker.graph.report())
    finally:
        worker.close()
        device.close()
        registry.close()
    _, registry, device, worker = built(bf16_model, home, "sm_90", prefill_rows=False)
    try:
        unfused = [launch.band.row.name for launch in worker.graph.launches(sum(LENGTHS), 2)]
    finally:
        worker.close()
        device.close()
        registry.close()
    fused = [ROWS["rmsnorm_gemm3"], ROWS["ffn"], ROWS["qkv"], ROWS["ffn"]]
    assert [name for name in above if name.endswith("_tc_dev") and "rmsnorm" in name] == fused, above
    assert above.count("r4dchain_add_dev") == 1 and "r4dchain_add_rmsnorm_dev" not in above, above
    assert not {"r4dchain_silu_mul_dev", "r4dchain_rmsnorm_dev"} & set(above[:above.index("r4dchain_add_dev")])
    # nothing else changes against libr4d without these rows: drop each fused row and the rows it
    # replaces there (add + norm, the norm, the three or two GEMMs, silu_mul; the o and down projections
    # stay plain GEMMs either way, the last add r4d_add_dev)
    replaced = {"r4dchain_add_rmsnorm_dev", "r4dchain_add_dev", "r4dchain_rmsnorm_dev", "r4dchain_silu_mul_dev",
                "r4dchain_gemm_tc_bf16_dev"}
    gemms_kept = 2 * SHAPE["layers"]
    others = [name for name in above if name not in fused and name not in replaced]
    assert others == [name for name in unfused if name not in replaced], (above, unfused)
    assert above.count("r4dchain_gemm_tc_bf16_dev") == gemms_kept, above
    assert unfused.count("r4dchain_gemm_tc_bf16_dev") == gemms_kept + 5 * SHAPE["layers"], unfused
    assert not any(name in below for name in fused) and below.count("r4dchain_add_rmsnorm_dev") == 3, below
    # --debug-selection's lines (Graph.report) name the rows, where they run and where the chain does
    assert "fused by libr4d, replaces add(residual,x,residual)+rmsnorm(residual,norm,normed)+gemm(normed,wq,q)" in report
    for op, row in (("add_rmsnorm_gemm3", ROWS["qkv"]), ("add_rmsnorm_gemm2_silu_mul", ROWS["ffn"]),
                    ("rmsnorm_gemm3", ROWS["rmsnorm_gemm3"])):
        assert f"{op} M=[256, 512] device: libr4d:{row}" in report, op
    assert "M >= 256 does not hold for M in [1, 255]" in report


def test_a_prefill_gives_the_same_bits_grouped_chained_and_unfused(bf16_model, home, monkeypatch):
    """sm_90: the grouped and SwiGLU launches (no silu_mul, no per-GEMM narrowing of the normed rows);
    R4D_PREFILL_FUSED=0: the chain's own launches. `h` and the tokens the same bits in all three and
    as without fusions. (Not on a fake sm_89: its lm head is gemv.cu's, which has no fake form; the
    rows' own fallback on sm_89: tests/test_prefill_rows.py.)"""
    target = "sm_90"
    monkeypatch.delenv("R4D_PREFILL_FUSED", raising=False)
    grouped = prefill(bf16_model, home, target)
    monkeypatch.setenv("R4D_PREFILL_FUSED", "0")
    chained = prefill(bf16_model, home, target)
    monkeypatch.delenv("R4D_PREFILL_FUSED")
    unfused = prefill(bf16_model, home, target, fusion=False)
    group = {"r4d_tma_gemm_bf16_group", "r4d_tma_gemm_bf16_swiglu", "r4d_tma_maps_group"}
    assert group <= set(grouped["kernels"]) and not group & set(chained["kernels"])
    assert grouped["kernels"].count("r4d_add_rmsnorm_bf16_dev") == chained["kernels"].count("r4d_add_rmsnorm_bf16_dev") == 4
    # x narrowed only before the o and down projections' plain TMA GEMMs (the chain: before each GEMM)
    assert grouped["kernels"].count("r4d_narrow_bf16_dev") == 2 * SHAPE["layers"], grouped["kernels"]
    assert chained["kernels"].count("r4d_narrow_bf16_dev") == 7 * SHAPE["layers"], chained["kernels"]
    assert "r4d_silu_mul_dev" not in grouped["kernels"] and "r4d_silu_mul_dev" in chained["kernels"]
    assert grouped["rows"] == chained["rows"] and unfused["rows"] != grouped["rows"]
    for other in (chained, unfused):
        assert grouped["tokens"] == other["tokens"]
        assert grouped["h"].view(np.uint32).tobytes() == other["h"].view(np.uint32).tobytes()
    assert np.isfinite(grouped["h"]).all() and np.abs(grouped["h"]).max() > 0
