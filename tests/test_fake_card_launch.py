"""A card launch on fake cards, through the real launcher (real rank processes, real zmq, real
shared memory): each rank is pinned to a fake card (RADIANCE_TEST_FAKE_CARDS), probes P2P with its
peers through IPC handles, and runs its session's card wiring (HostPeers -> DevicePeers -> the device
executor) with the fixture library's device rows; the fake card runs libref's arithmetic and the
device collectives' kernels in Python (tests/fixtures/fakecard.py). TP 2 gives TP 1's tokens, TP 1
on a card launches at all (its P2P probe has no peer), and nothing is left behind."""

from pathlib import Path

import pytest

from radiance.config import Config
from radiance.generation.sequence import SamplingParams
from radiance.launch import engine_over, open_ranks

FIXTURES = Path(__file__).parent / "fixtures"
PROMPTS = [list(range(1, 30)), [5, 9, 200, 17]]
SHM = Path("/dev/shm")


@pytest.fixture
def fake_cards(tmp_path, monkeypatch):
    """Two fake cards on this machine, a home holding the fake card's row library, and a kernel
    cache of the test's own; what the ranks inherit from this process's environment."""
    kernels = tmp_path / "home" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "fakedev.py").write_text((FIXTURES / "fakedev.py").read_text())
    monkeypatch.setenv("RADIANCE_TEST_FAKE_CARDS", "2")
    monkeypatch.setenv("RADIANCE_TEST_FAKE_KERNELS", str(FIXTURES / "fakecard.py"))
    monkeypatch.setenv("RADIANCE_KERNEL_CACHE", str(tmp_path / "kernel-cache"))
    return str(tmp_path / "home")


def generate(model, home, tp=1, launched=True, disable_p2p=False, run_ahead=None):
    """Greedy tokens of PROMPTS, and what the launch agreed on."""
    # f32 on the wire: the tiny model is bf16, whose default wire (bf16) would round every all-reduce,
    # and these tokens are held to the host path's exactly (tests/test_fake_card_fused.py has bf16)
    config = Config(model=str(model), radiance_home=home, kernels="fakedev,libref", accept_reference=True,
                    progress=False, max_seqs=2, tp=tp, launched=launched, disable_p2p=disable_p2p, run_ahead=run_ahead,
                    collective_wire="f32")
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        assert engine.run_ahead is bool(run_ahead)  # not by default on cards: not measured on one yet
        sequences = [engine.add(p, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)) for p in PROMPTS]
        while engine.scheduler.has_work:
            engine.step()
        pids = [rank.pid for rank in ranks.coordinator.ranks] if launched else []
        agreed = {"lines": list(ranks.lines), "facts": dict(getattr(ranks, "facts", {})),
                  "run_id": ranks.coordinator.folder.run_id if launched else None, "pids": pids}
    return [s.output_ids for s in sequences], agreed


def leftovers(agreed) -> list[str]:
    left = [str(p) for p in SHM.glob(f"rad.{agreed['run_id']}.*")]
    return left + [str(p) for pid in agreed["pids"] for p in SHM.glob(f"radfake.{pid}.*")]


@pytest.fixture(scope="module")
def host_tokens(tiny_model):
    config = Config(model=str(tiny_model), radiance_home="", kernels="libref", accept_reference=True,
                    progress=False, max_seqs=2, device="host")
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        sequences = [engine.add(p, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)) for p in PROMPTS]
        while engine.scheduler.has_work:
            engine.step()
        return [s.output_ids for s in sequences]


def test_one_card_rank_launches_and_gives_the_host_paths_tokens(tiny_model, fake_cards, host_tokens):
    tokens, agreed = generate(tiny_model, fake_cards, tp=1)
    assert tokens == host_tokens
    # one rank: no peer to probe, nothing to refuse; the fake card has programmatic launch (device.chain)
    assert agreed["facts"] == {"device.p2p": 1, "device.chain": 1}
    assert all(line.split("|")[3].startswith("fakedev:") for line in agreed["lines"])
    assert leftovers(agreed) == []


@pytest.mark.parametrize("disable_p2p", [False, True], ids=["p2p", "host-staged"])
def test_two_fake_cards_give_one_cards_tokens(tiny_model, fake_cards, host_tokens, disable_p2p):
    tokens, agreed = generate(tiny_model, fake_cards, tp=2, disable_p2p=disable_p2p)
    assert tokens == host_tokens
    # fake IPC handles open across processes
    assert agreed["facts"] == {"device.p2p": 0 if disable_p2p else 1, "device.chain": 1}
    rows = {line.split("|")[3] for line in agreed["lines"] if line.split("|")[1].startswith("all_")}
    assert rows == {"fakedev:fakedev_all_reduce", "fakedev:fakedev_all_gather"}, rows
    assert leftovers(agreed) == []


def test_two_fake_cards_run_ahead_to_one_cards_tokens(tiny_model, fake_cards, host_tokens):
    """Run ahead through the real launcher: each rank's step takes its ids from its own card's token
    buffer (radiance/engine/running/device.py), the coordinator never sending a token."""
    tokens, agreed = generate(tiny_model, fake_cards, tp=2, run_ahead=True)
    assert tokens == host_tokens
    assert leftovers(agreed) == []


@pytest.mark.parametrize("run_ahead", [None, True], ids=["synchronous", "run-ahead"])
def test_in_process_pins_itself_to_the_first_fake_card(tiny_model, fake_cards, host_tokens, monkeypatch, run_ahead):
    monkeypatch.setenv("RADIANCE_TEST_FAKE_CARD", "unset")  # so monkeypatch removes what the pinning sets
    monkeypatch.delenv("RADIANCE_TEST_FAKE_CARD")
    tokens, agreed = generate(tiny_model, fake_cards, launched=False, run_ahead=run_ahead)
    import os

    assert os.environ.get("RADIANCE_TEST_FAKE_CARD") == "0"  # pinned by InProcessRanks, as a launcher pins
    assert tokens == host_tokens
    assert all(line.split("|")[3].startswith("fakedev:") for line in agreed["lines"])


def test_a_bad_fake_card_count_is_a_one_line_error(monkeypatch):
    from radiance.launch.devices import visible_cards

    monkeypatch.setenv("RADIANCE_TEST_FAKE_CARDS", "two")
    with pytest.raises(ValueError, match=r"RADIANCE_TEST_FAKE_CARDS=two: a count of fake cards \(for tests\)"):
        visible_cards()


def test_more_ranks_than_cards_is_a_one_line_error_before_anything_starts(tiny_model, fake_cards):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "radiance.tools.launch", "--tp", "4", "--model", str(tiny_model),
                             "--prompt", "hi"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip().splitlines()[-1] == "radiance-launch: error: --tp 4 needs 4 cards, 2 visible (fake 0, fake 1)"


def test_a_rank_killed_on_its_fake_card_leaves_no_card_memory_behind(tiny_model, fake_cards):
    """A rank SIGKILLed (as the supervisor's last resort kills one) frees nothing itself: its fake
    card's files are named as the run's segments (rad.<run>.fake.<pid>...), so the launcher's
    teardown sweeps them with the rest of the run."""
    import time

    from launch_support import Launch, kill, wait_gone

    launch = Launch("--tp", 2, "--model", tiny_model, "--radiance-home", fake_cards, "--kernels", "fakedev,libref",
                    "--debug-accept-reference-kernels", "--collective-wire", "f32", "--prompt", "hello",
                    "--max-tokens", 200, "--temperature", 0)
    ranks = launch.wait_for_ranks(2, timeout=60)
    victim = ranks[1]

    def card_files():  # however the fake card names them: a rank's pid follows "fake."
        return [str(p) for rank in ranks for p in SHM.glob(f"*fake.{rank.pid}.*")]
    deadline = time.monotonic() + 60
    while not any(f".{victim.pid}." in name for name in card_files()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(f".{victim.pid}." in name for name in card_files()), "rank 1 allocated nothing on its card"
    kill(victim)
    code, _, stderr = launch.finish(timeout=60)
    assert code != 0 and "rank 1 failed first: killed by SIGKILL" in stderr, stderr[-2000:]
    assert wait_gone(launch) == []
    assert card_files() == []
