"""The row family on a card (allreduce_fused.cu through nvrtc, the engine's own compile): two spawned
processes, one a card where two are visible, else both on the one card (IPC handles open between
two processes of one device; the card time-slices their kernels, so this checks results, not speed).
tests/fused_support.py runs the checks; each test asserts its part of the report:

  - the fused row (libr4d's all_reduce_add_rmsnorm_p2p[_host]) leaves the same bits as the chain of
    libr4d's real device rows it replaces (all_reduce_p2p, r4dchain_add_dev, r4dchain_rmsnorm_dev),
    and both equal the numpy mirror: the rank-order sum, the add, r4d_row_squares' order;
  - with f32 and with bf16 on the wire, P2P and host-staged, both exchanges (LL, slots) forced, for a
    decode row of 4096, an odd width, the LL limit (8 x 4096) and a 1 MiB prefill chunk (the slots);
  - three fused launches captured in a CUDA graph, replayed three times with new inputs; ranks at
    random speeds; the gate word ended by every launch; no wait timed out; nothing left in /dev/shm.

Skips, naming why, without an NVIDIA card. Run: PYTHONUNBUFFERED=1 python3 bench/allreduce_fused.py
--tests (docs/COLLECTIVES.md, "The row family")."""

import multiprocessing as mp

import pytest

from radiance.collectives.shm import new_run_id, unlink_run

from fused_support import check_reports, form_name, rank_main
from ranks_support import cards_reason, run_ranks

WORLD = 2
FORMS = [(True, "f32"), (False, "f32"), (True, "bf16"), (False, "bf16")]
PLAN = {"device": "cuda", "forms": FORMS, "shapes": [(1, 4096), (3, 4097), (8, 4096), (64, 4096)],
        "buffer": 64 * 4096 * 4, "ll_max": None, "skewed": 20}

REASON = cards_reason(1, "the row family's card tests")


def visible_cards() -> int:
    from cuda.bindings import driver
    driver.cuInit(0)
    return int(driver.cuDeviceGetCount()[1])


@pytest.fixture(scope="module")
def card_reports():
    if REASON is not None:
        pytest.skip(REASON)
    cards = visible_cards()
    context, run_id = mp.get_context("spawn"), new_run_id()
    queue, barrier = context.Queue(), context.Barrier(WORLD)
    processes = [context.Process(target=rank_main, args=(r, WORLD, run_id, barrier, queue, PLAN,
                                                         {"CUDA_VISIBLE_DEVICES": str(r % cards)}))
                 for r in range(WORLD)]
    try:
        return run_ranks(processes, queue, timeout=900)
    finally:
        unlink_run(run_id)


@pytest.mark.parametrize("form", FORMS, ids=[form_name(*form) for form in FORMS])
def test_the_fused_kernel_leaves_the_chains_bits_and_the_mirrors(card_reports, form):
    assert check_reports(WORLD, card_reports, {**PLAN, "forms": [form]}) == []

