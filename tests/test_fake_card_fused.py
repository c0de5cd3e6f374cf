"""The fused all_reduce + residual add + rmsnorm device row in a real launch on fake cards: the real
launcher, real rank processes each pinned to a fake card, their P2P probe, HostPeers -> DevicePeers ->
the device executor with decode graphs captured and replayed.

libr4d serves the chain's links here as on a card: the test home carries a copy of libr4d whose
build target also names the fake card, behind the fixture library fakedev, which leaves add, rmsnorm
and all_reduce to it (and runs every other op with libref's arithmetic). The fake card runs libr4d's
collective kernels and its add and rmsnorm kernels in Python (tests/fixtures/fakecard.py). Checked:
selection takes libr4d's fused row at every all_reduce -> add -> norm of a TP 2 llama graph (and
--debug-selection says so); the residual stream `h` after every step, prefill and decode, graphs
replayed, is the same bits fused and unfused at TP 2 (P2P, f32 on the wire; host-staged, bf16 on the
wire) and TP 3; bf16 on the wire stays near f32."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import radiance.plugins.kernels.libr4d as libr4d_package
from radiance.config import Config
from radiance.generation.sequence import SamplingParams
from radiance.launch import engine_over, open_ranks

FIXTURES = Path(__file__).parent / "fixtures"
PROMPTS = [list(range(1, 30)), [5, 9, 200, 17]]
SHM = Path("/dev/shm")
KERNELS = "fakedev,libr4d,libref"
FUSED = "all_reduce_add_rmsnorm"
THIRDS = dict(hidden=96, layers=2, heads=6, kv_heads=3, ffn=192, vocab=384, context=256)  # every split by 3


def fused_home(root: Path) -> str:
    """A home with fakedev (leaving add, rmsnorm and all_reduce to the next library) and a copy of
    libr4d whose device code also runs on the fake card."""
    kernels = root / "home" / "kernels"
    kernels.mkdir(parents=True)
    fakedev = (FIXTURES / "fakedev.py").read_text()
    assert "LEAVE = ()" in fakedev
    (kernels / "fakedev.py").write_text(fakedev.replace("LEAVE = ()", 'LEAVE = ("add", "rmsnorm", "all_reduce")'))
    shutil.copytree(Path(libr4d_package.__file__).parent, kernels / "libr4d",
                    ignore=shutil.ignore_patterns("__pycache__"))
    init = kernels / "libr4d" / "__init__.py"
    text = init.read_text()
    assert text.count('"host cuda hip")') == 1
    init.write_text(text.replace('"host cuda hip")', '"host cuda hip fake")'))
    return str(root / "home")


@pytest.fixture(scope="module")
def fake_cards(tmp_path_factory):
    """Three fake cards, the home above and a kernel cache of the module's own, for every launch here."""
    root = tmp_path_factory.mktemp("fused-cards")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RADIANCE_TEST_FAKE_CARDS", "3")
        patch.setenv("RADIANCE_TEST_FAKE_KERNELS", str(FIXTURES / "fakecard.py"))
        patch.setenv("RADIANCE_KERNEL_CACHE", str(root / "kernel-cache"))
        yield fused_home(root)


@pytest.fixture(scope="module")
def thirds_model(tmp_path_factory):
    from radiance.convert.api import convert_synthetic

    path = tmp_path_factory.mktemp("thirds") / "thirds.rad"
    convert_synthetic(path, "llama", THIRDS, seed=11)
    return path


RUNS: dict = {}  # the launches of this module, each run once whichever test asks first


def generate(model, home, tp, fusion=True, wire="f32", disable_p2p=False):
    key = (str(model), tp, fusion, wire, disable_p2p)
    if key not in RUNS:
        RUNS[key] = _generate(model, home, tp, fusion, wire, disable_p2p)
    return RUNS[key]


def _generate(model, home, tp, fusion, wire, disable_p2p):
    """Greedy tokens, rank 0's `h` after every step, the resolved lines; nothing left in /dev/shm."""
    config = Config(model=str(model), radiance_home=home, kernels=KERNELS, accept_reference=True, progress=False,
                    max_seqs=2, tp=tp, launched=True, disable_p2p=disable_p2p, fusion=fusion, collective_wire=wire,
                    return_buffer="h")
    residuals = []
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        sequences = [engine.add(p, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)) for p in PROMPTS]
        while engine.scheduler.has_work:
            engine.step()
            residuals.append(np.array(ranks.last_result["h"]))
        run_id, pids = ranks.coordinator.folder.run_id, [rank.pid for rank in ranks.coordinator.ranks]
        lines = list(ranks.lines)
    left = [str(p) for p in SHM.glob(f"rad.{run_id}.*")] + \
        [str(p) for pid in pids for p in SHM.glob(f"radfake.{pid}.*")]
    assert left == []
    return [s.output_ids for s in sequences], residuals, lines


def rows_of(lines, op):
    return sorted({line.split("|")[3] for line in lines if line.split("|")[1] == op})


def assert_same_bits(fused, unfused):
    tokens, residuals, _ = fused
    assert tokens == unfused[0]
    assert len(residuals) == len(unfused[1]) == 6   # the prefill and five decode steps
    for step, (a, b) in enumerate(zip(residuals, unfused[1])):
        assert a.view(np.uint32).tobytes() == b.view(np.uint32).tobytes(), f"h differs after step {step}"


@pytest.mark.parametrize("disable_p2p,wire", [(False, "f32"), (True, "bf16")], ids=["p2p-f32", "host-staged-bf16"])
def test_tp2_the_fused_row_runs_and_leaves_the_chains_bits(tiny_model, fake_cards, disable_p2p, wire):
    fused = generate(tiny_model, fake_cards, 2, wire=wire, disable_p2p=disable_p2p)
    unfused = generate(tiny_model, fake_cards, 2, fusion=False, wire=wire, disable_p2p=disable_p2p)
    twin = "_host" if disable_p2p else ""
    assert rows_of(fused[2], FUSED) == [f"libr4d:all_reduce_add_rmsnorm_p2p{twin}"]
    assert sum(f"|{FUSED}|" in line for line in fused[2]) == 3     # every all_reduce but the last layer's ffn
    assert rows_of(fused[2], "all_reduce") == [f"libr4d:all_reduce_p2p{twin}"]
    assert rows_of(unfused[2], FUSED) == [] and rows_of(unfused[2], "rmsnorm") == ["libr4d:r4dchain_rmsnorm_dev"]
    assert_same_bits(fused, unfused)


def test_tp3_the_fused_row_leaves_the_chains_bits(thirds_model, fake_cards):
    fused = generate(thirds_model, fake_cards, 3)
    unfused = generate(thirds_model, fake_cards, 3, fusion=False)
    assert rows_of(fused[2], FUSED) == ["libr4d:all_reduce_add_rmsnorm_p2p"]
    assert_same_bits(fused, unfused)


def test_bf16_on_the_wire_stays_near_f32_over_a_whole_prefill(tiny_model, fake_cards):
    """Two layers' four all-reduces with bf16 on the wire against f32 (each within its stated
    tolerance, test_device_fused_fake.py): the residual stream after the prefill within 1 % of its
    largest value, and not the same bits (the wire did round)."""
    _, exact, _ = generate(tiny_model, fake_cards, 2, wire="f32")
    _, wired, _ = generate(tiny_model, fake_cards, 2, wire="bf16", disable_p2p=True)   # the same arithmetic
    difference = float(np.max(np.abs(wired[0] - exact[0])) / np.max(np.abs(exact[0])))
    assert 0 < difference <= 0.01, difference


def test_debug_selection_shows_the_fused_row_in_a_tp2_launch(tiny_model, fake_cards):
    environment = {**os.environ, "RADIANCE_HOME": fake_cards}
    done = subprocess.run([sys.executable, "-m", "radiance.tools.launch", "--tp", "2", "--model", str(tiny_model),
                           "--kernels", KERNELS, "--debug-accept-reference-kernels", "--debug-selection",
                           "--prompt", "hi", "--max-tokens", "2", "--temperature", "0"],
                          capture_output=True, text=True, timeout=600, env=environment)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = done.stderr
    assert "fused by libr4d, replaces all_reduce(x)+add(residual,x,residual)+rmsnorm(residual,w,y)" in shown
    assert "layers.0.attn.all_reduce+layers.0.attn.residual+layers.0.ffn_norm" in shown
    assert "libr4d:all_reduce_add_rmsnorm_p2p" in shown
