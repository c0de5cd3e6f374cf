"""The coordinator's end of a step (launch/step_rings.py): run ahead, when it expects rank 0's result."""

import secrets
import time
from types import SimpleNamespace

import numpy as np

from radiance.collectives.result_record import FIGURES, ResultWriter
from radiance.collectives.ring import RingWriter
from radiance.collectives.shm import list_run, new_run_id, unlink_run
from radiance.config import Config
from radiance.generation.engine import Engine
from radiance.generation.sequence import SamplingParams
from radiance.launch.step_rings import AHEAD_SHARE, StepRings


def _plan_arrays(config: Config) -> dict:
    """One step's plan arrays, as the engine makes them."""
    plans = []

    def execute(arrays):
        plans.append(arrays)
        return np.zeros(len(arrays["step.context_lens"]), np.int32)

    engine = Engine(config, execute, SimpleNamespace(stop_ids=set()))
    engine.add([1, 2, 3, 4], SamplingParams(max_tokens=1))
    engine.step()
    return plans[0]


def test_run_ahead_a_result_is_due_by_rank_0s_clock_not_the_coordinators(tiny_model):
    """Rank 0 stamps when it answered (its perf_counter, the coordinator's clock on one node): run
    ahead, the next result is due its last step after that stamp. Counted from the coordinator's own
    arrival instead, every nap and every plan of the coordinator's would make it later, and it woke
    too early by as much. The stamps here are a long way off, so the due time is rank 0's alone."""
    config = Config(model=str(tiny_model), max_seqs=4, max_step_tokens=16)
    run_id, secret = new_run_id(), secrets.token_bytes(32)
    results = RingWriter.create(run_id, "results", 1, 2, 4096, secret)  # rank 0's end
    try:
        rings = StepRings(run_id, 1, secret, config)
        try:
            waits = []
            read = rings.results.read
            rings.results.read = lambda **waiting: (waits.append(waiting), read(**waiting))[1]
            arrays = _plan_arrays(config)
            for _ in range(3):  # step 1 to 3 out: while step 1 runs, 2 and 3 are ahead of it
                rings.publish(arrays, None, 5.0, lambda: None)
            first = rings.sent[0][0]  # when step 1 went out, rank 0 ready for it
            step_s = 50.0  # rank 0's step 1, by its stamps
            writer, tokens = ResultWriter(), np.zeros(1, np.int32)
            for k in (1, 2):
                figures = dict.fromkeys(FIGURES, 0.0) | {"answered_at": first + k * step_s, "received_at": first}
                results.publish(writer.encode(tokens, figures), timeout=5.0)
            rings.result(5.0, lambda: None)
            before = time.perf_counter()
            rings.result(5.0, lambda: None)
            after = time.perf_counter()
            # step 2 began when rank 0 answered step 1 (its plan was out long before): due a step after
            due = first + step_s + AHEAD_SHARE * step_s
            assert waits[1]["spin_s"] == 0.0 and waits[1]["poll_s"] > 0
            assert due - after <= waits[1]["expect_s"] <= due - before, (waits[1], due - before)
        finally:
            rings.close()
    finally:
        results.close()
        unlink_run(run_id)
    assert not list_run(run_id)
