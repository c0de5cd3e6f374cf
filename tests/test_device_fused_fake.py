"""The row family on fake cards between real processes (2 and 3; tests/fused_support.py runs the
checks): DevicePeers with each wire and both forms (P2P regions opened by IPC handle, host-staged
regions in shared memory), the fused row (libr4d's all_reduce_add_rmsnorm_p2p[_host]) against the
chain it replaces run through libr4d's own rows (all_reduce_p2p, r4dchain_add_dev,
r4dchain_rmsnorm_dev), bit for bit, and both against the numpy mirror; both exchanges forced; three
launches captured in a graph and replayed with new inputs (the epochs live on the card, so replays
keep the ranks in step); launches with the ranks at random speeds; bf16 on the wire within its
stated tolerance of f32.

The fake card runs Python forms of the kernels (tests/fixtures/fakecard.py): their protocol (epochs,
slots, LL words and flags, READY flags, the gate) and the mirror's arithmetic, not the CUDA. The
CUDA's own bits are held to the chain and the mirror on a card (tests/test_device_fused_card.py)."""

import multiprocessing as mp

import numpy as np
import pytest

from radiance.collectives.shm import new_run_id, unlink_run

from fused_support import check_reports, contribution, form_name, rank_main
from ranks_support import run_ranks

FORMS = [(True, "f32"), (False, "f32"), (True, "bf16"), (False, "bf16")]
# a decode row, a few rows of an odd width, a prefill chunk over the (lowered) LL limit
PLAN = {"device": "fake", "forms": FORMS, "shapes": [(1, 576), (3, 577), (20, 256)], "buffer": 64 << 10,
        "ll_max": 8 << 10, "skewed": 8}
# bf16 on the wire against f32 (docs/OPS.md "Fused ops"): each contribution and the sum rounded to
# bf16 (8 significant bits: a rounding moves a value by at most 2^-8 of it), so the all-reduce is within
# 2^-7 (1 + 2^-7) of the sum of the contributions' magnitudes, element by element; the norm's output
# within 1e-2 of its largest value
BF16_SUM_TOLERANCE = 2.0 ** -7 * (1 + 2.0 ** -7)
BF16_NORM_TOLERANCE = 1e-2


@pytest.fixture(scope="module", params=[2, 3], ids=["tp2", "tp3"])
def reports(request, tmp_path_factory):
    world, cache = request.param, tmp_path_factory.mktemp(f"fused{request.param}")
    context, run_id = mp.get_context("spawn"), new_run_id()
    queue, barrier = context.Queue(), context.Barrier(world)
    environment = {"RADIANCE_KERNEL_CACHE": str(cache)}
    processes = [context.Process(target=rank_main, args=(r, world, run_id, barrier, queue, PLAN, environment))
                 for r in range(world)]
    try:
        return world, run_ranks(processes, queue, timeout=900)
    finally:
        unlink_run(run_id)


@pytest.mark.parametrize("form", FORMS, ids=[form_name(*form) for form in FORMS])
def test_the_fused_row_equals_the_chain_and_the_mirror_and_replays_in_step(reports, form):
    world, ranks = reports
    plan = {**PLAN, "forms": [form]}
    assert check_reports(world, ranks, plan) == []
    # the plain all_reduce's form by size: LL up to the limit, then allreduce.cu's one-shot (which moves
    # f32 as f32) or, on a bf16 wire, the row kernel through the slots
    larger = "one_shot" if form[1] == "f32" else "rows"
    assert [ranks[0][form_name(*form)][f"{m}x{n}"]["form"] for m, n in PLAN["shapes"]] == ["ll", "ll", larger]


def test_bf16_on_the_wire_stays_within_its_stated_tolerance_of_f32(reports):
    """The fused row's results with bf16 on the wire against its results with f32, from the runs above."""
    world, ranks = reports
    worst = {"sum": 0.0, "norm": 0.0}
    for m, n in PLAN["shapes"]:
        arrays = {wire: {name: np.frombuffer(raw, np.float32).reshape(m, n)
                         for name, raw in ranks[0][f"p2p {wire}"][f"{m}x{n}"]["fused"].items()} for wire in ("f32", "bf16")}
        magnitude = np.sum(np.abs(np.stack([contribution(r, m, n, m * 1000 + n) for r in range(world)])), axis=0)
        exact, wired = arrays["f32"], arrays["bf16"]
        assert not np.array_equal(wired["x"], exact["x"])   # the wire does round
        worst["sum"] = max(worst["sum"], float(np.max(np.abs(wired["x"] - exact["x"]) / magnitude)))
        worst["norm"] = max(worst["norm"], float(np.max(np.abs(wired["y"] - exact["y"])) / np.max(np.abs(exact["y"]))))
    assert worst["sum"] <= BF16_SUM_TOLERANCE and worst["norm"] <= BF16_NORM_TOLERANCE, worst
