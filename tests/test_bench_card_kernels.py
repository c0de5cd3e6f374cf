"""bench/card_kernels.py's table by op, without a card: a stand-in executor whose step launches
kernels through its device and reports each row's end through the engine's check_status, as the
card executor does (radiance/engine/running/device.py), and stand-in CUPTI events. So the first card
run of `card_generate.py --kernels` spends the card's time on the figures, not on the labels."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from radiance.engine.running import device as running

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("card_kernels", ROOT / "bench" / "card_kernels.py")
card_kernels = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(card_kernels)


def node_launch(op, name, **geometry):
    return SimpleNamespace(node=SimpleNamespace(op=op, name=name), band=SimpleNamespace(geometry=geometry))


# one layer of two and the head: (the row launch, its kernels (name, grid))
STEP = [(node_launch("rmsnorm_gemm3", f"blk.{layer}.attn_qkv", K=4096, **{"N.1": 4096, "N.2": 1024, "N.3": 1024},
                     wdtype="bf16"), [("r4d_gemv_m1", (192, 2, 1))]) for layer in (0, 1)]
STEP += [(node_launch("gemm_add", "blk.1.attn_output", N=4096, K=4096, wdtype="bf16"), [("r4d_gemv_m1", (128, 4, 1))]),
         (node_launch("take_rows_rmsnorm_gemm_sample", "output", N=128256, K=4096, wdtype="q8_0"),
          [("r4d_gemv_m1", (4008, 1, 1)), ("r4d_sample_groups_dev", (1, 1, 1))])]


class Executor:
    def __init__(self):
        self.device = SimpleNamespace(launch=self.launched)
        self._graphs = {(1, 1): "the graph captured before"}
        self.kernels = []

    def launched(self, kernel, grid, block, args, shared=0, **options):
        self.kernels.append(kernel.name)

    def run(self, tokens, seqs):
        assert (tokens, seqs) not in self._graphs, "the step's graph is dropped, so the step is captured again"
        for launch, kernels in STEP:
            for name, grid in kernels:
                self.device.launch(SimpleNamespace(name=name), grid, (128, 1, 1), None)
            running.check_status(launch, SimpleNamespace(collective=0), 0)
        self._graphs[(tokens, seqs)] = "captured again"


def test_each_launch_is_labelled_by_its_op_node_and_grid_with_its_weight_bytes():
    executor, check = Executor(), running.check_status
    labels = card_kernels.capture_labelled(executor, (1, 1))
    assert running.check_status is check and executor.device.launch == executor.launched  # put back
    assert len(executor.kernels) == len(labels) == 5
    assert labels[0] == labels[1] == ("rmsnorm_gemm3 blk.#.attn_qkv r4d_gemv_m1 grid 192,2", 6144 * 4096 * 2.0)
    assert labels[2] == ("gemm_add blk.#.attn_output r4d_gemv_m1 grid 128,4", 4096 * 4096 * 2.0)
    assert labels[3] == ("take_rows_rmsnorm_gemm_sample output r4d_gemv_m1 grid 4008,1", 128256 * 4096 * 34 / 32)
    assert labels[4] == ("take_rows_rmsnorm_gemm_sample output r4d_sample_groups_dev", None)


def test_kernels_of_replays_add_up_by_label_with_their_rate():
    labels = [("qkv", 50e6), ("o", 25e6), ("sample", None)]
    events = [SimpleNamespace(time_range=SimpleNamespace(elapsed_us=lambda us=us: us))
              for _ in range(2) for us in (20.0, 10.0, 3.0)]  # two replays of three kernels
    table = card_kernels.by_label(events, labels, replays=2)
    assert table["qkv"] == {"us_per_step": 20.0, "calls_per_step": 1.0, "us_each": 20.0, "tb_per_s": pytest.approx(2.5)}
    assert table["o"]["tb_per_s"] == pytest.approx(2.5) and table["sample"]["tb_per_s"] is None
    assert list(table) == ["qkv", "o", "sample"]  # by time


def test_chained_kernels_are_counted_by_what_they_add_to_the_step():
    """Chained kernels overlap: each gets its end less the end of the kernel before it in its replay
    (the first its own time), so the labels add up to the step's span."""
    labels = [("qkv", 50e6), ("attention", None), ("o", 25e6)]
    spans = [(0.0, 20.0), (5.0, 30.0), (10.0, 35.0)]  # (start, end) us: attention and o start early
    events = [SimpleNamespace(time_range=SimpleNamespace(start=start + 100 * replay, end=end + 100 * replay,
                                                         elapsed_us=lambda s=start, e=end: e - s))
              for replay in range(2) for start, end in spans]
    table = card_kernels.by_label(events, labels, replays=2, span=True)
    assert [table[name]["us_per_step"] for name in ("qkv", "attention", "o")] == [20.0, 10.0, 5.0]
    assert sum(row["us_per_step"] for row in table.values()) == 35.0  # the step's span
    assert table["o"]["tb_per_s"] == pytest.approx(5.0)
    own = card_kernels.by_label(events, labels, replays=2)
    assert [own[name]["us_per_step"] for name in ("qkv", "attention", "o")] == [20.0, 25.0, 25.0]
