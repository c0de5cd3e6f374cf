"""The plans ring's record (generation/plan_record.py): a step's arrays and feed round trip into a
rank's step inputs, byte for byte, and a record that does not fit is refused in one line."""

import contextlib

import numpy as np
import pytest

from radiance.abi import PLANNED, STEP_INPUTS
from radiance.engine.running.step_inputs import StepInputs
from radiance.generation import plan_record
from radiance.generation.feed import Feed
from radiance.generation.plan_record import PlanReader, PlanRecordError
from test_ring import use_ring_take


def _arrays(tokens: int, seqs: int, blocks: int, seed: int = 0) -> dict:
    """Plan arrays of every step input, filled with distinct values."""
    generator = np.random.default_rng(seed)
    return {name: generator.integers(1, 1 << 20, spec.shape(tokens, seqs, blocks)).astype(spec.dtype)
            for name, spec in ((name, STEP_INPUTS[name]) for name in PLANNED)}


def test_a_plan_goes_into_the_step_inputs_as_planned():
    inputs = StepInputs(16, 4, 8)
    reader = PlanReader(inputs)
    for tokens, seqs, feed in [(9, 3, None), (2, 2, Feed.of([(1, 0), (0, 1)])), (9, 3, Feed.of([(8, 2)]))]:
        arrays = _arrays(tokens, seqs, 8, seed=tokens + seqs)
        plan = reader.decode(plan_record.encode(arrays, feed))
        assert (plan.kind, plan.tokens, plan.seqs, plan.blocks, plan.feed) == ("step", tokens, seqs, 8, feed)
        reader.write(plan)
        viewed = reader.arrays(plan)
        for name in PLANNED:
            rows = len(arrays[name])
            assert np.array_equal(inputs[name][:rows], arrays[name]), name
            assert np.array_equal(viewed[name], arrays[name]) and viewed[name].dtype == arrays[name].dtype, name
    assert reader.decode(plan_record.stop()).kind == "stop"


def test_a_narrower_block_table_is_written_row_by_row():
    inputs = StepInputs(16, 4, 8)
    inputs["step.block_tables"][:] = -1
    arrays = _arrays(3, 3, 5)
    PlanReader(inputs).write(PlanReader(inputs).decode(plan_record.encode(arrays)))
    assert np.array_equal(inputs["step.block_tables"][:3, :5], arrays["step.block_tables"])
    assert (inputs["step.block_tables"][:3, 5:] == -1).all()


def test_a_record_that_does_not_fit_is_refused_in_one_line():
    reader = PlanReader(StepInputs(16, 4, 8))
    payload = plan_record.encode(_arrays(4, 2, 8), Feed.of([(0, 0)]))
    with pytest.raises(PlanRecordError,
                       match=r"plan record: \d+ bytes where its header \(4 tokens, 2 sequences, 1 fed\)"):
        reader.decode(payload[:-1])
    with pytest.raises(PlanRecordError, match="step.ids of a step of 17 tokens, 2 sequences and 8 blocks"):
        reader.write(reader.decode(plan_record.encode(_arrays(17, 2, 8))))
    with pytest.raises(PlanRecordError, match="kind b'what'"):
        reader.decode(b"what" + payload[4:])
    arrays = _arrays(4, 2, 8)
    arrays["step.top_p"] = arrays["step.top_p"].astype(np.float64)
    with pytest.raises(PlanRecordError, match=r"plan record: step.top_p is float64\[2\], expected float32\[2\]"):
        plan_record.encode(arrays)


def test_the_largest_record_is_its_size():
    arrays, feed = _arrays(16, 4, 8), Feed.of([(i, i) for i in range(4)])
    assert len(plan_record.encode(arrays, feed)) == plan_record.size(16, 4, 8, 4)


@pytest.mark.parametrize("way", ["python", "native"])
def test_plans_taken_from_a_ring_land_in_the_step_inputs_step_after_step(way):
    """Through a real ring, as a rank takes them (whole: the ring's take makes the copies of a plan
    of the last plan's shape in C, where libr4d builds): every plan's arrays land in the step inputs,
    whether its shape repeats the last one's, differs, or has a narrower block table; a stop ends."""
    import secrets

    from radiance.collectives.ring import RingReader, RingWriter
    from radiance.collectives.shm import new_run_id, unlink_run

    use_ring_take(way)
    run_id, secret = new_run_id(), secrets.token_bytes(32)
    writer = RingWriter.create(run_id, "plans", 1, 2, plan_record.size(16, 4, 8, 4), secret)
    reader = RingReader.attach(run_id, "plans", 0, secret)
    inputs = StepInputs(16, 4, 8)
    taker, made = PlanReader(inputs, whole=True), []
    try:
        steps = [(2, 2, 8), (2, 2, 8), (2, 2, 8), (9, 3, 8), (9, 3, 8), (3, 3, 5), (3, 3, 5), (2, 2, 8)]
        for seed, (tokens, seqs, blocks) in enumerate(steps):
            arrays, feed = _arrays(tokens, seqs, blocks, seed), Feed.of([(0, seqs - 1)])
            writer.publish(plan_record.encode(arrays, feed, sent=seed + 0.5))
            plan = taker.take(reader, timeout=5)
            made.append(reader.made if way == "native" else None)
            assert (plan.tokens, plan.seqs, plan.blocks, plan.feed, taker.sent()) == (tokens, seqs, blocks, feed,
                                                                                      seed + 0.5)
            for name in PLANNED:
                rows = arrays[name]
                got = inputs[name][:len(rows), :rows.shape[1]] if rows.ndim == 2 else inputs[name][:len(rows)]
                assert np.array_equal(got, rows), (seed, name)
        writer.publish(plan_record.stop())
        assert taker.take(reader, timeout=5).kind == "stop"
    finally:
        use_ring_take("python")
        reader.close()
        writer.close()
        unlink_run(run_id)
    # a repeated shape is copied in the ring's take, natively (its feed left to the step: no `feeds`);
    # a new shape is decoded and copied in Python
    assert made == ([0, 1, 1, 0, 1, 0, 1, 0] if way == "native" else [None] * 8)


@contextlib.contextmanager
def _native_plans():
    """A plans ring of one reader taken natively, with its step inputs and a feeding PlanReader
    (a host rank's); the ring unlinked and the Python take restored after."""
    import secrets

    from radiance.collectives.ring import RingReader, RingWriter
    from radiance.collectives.shm import new_run_id, unlink_run

    use_ring_take("native")
    run_id, secret = new_run_id(), secrets.token_bytes(32)
    writer = RingWriter.create(run_id, "plans", 1, 2, plan_record.size(16, 4, 8, 4), secret)
    reader = RingReader.attach(run_id, "plans", 0, secret)
    inputs = StepInputs(16, 4, 8)
    try:
        yield writer, reader, inputs, PlanReader(inputs, whole=True, feeds=True)
    finally:
        use_ring_take("python")
        reader.close()
        writer.close()
        unlink_run(run_id)


def _fed_steps(taker, writer, reader, inputs, steps, sampled):
    """Publish and take each (ids, feed pairs) of `steps` (one sequence a token, tokens == seqs),
    the step inputs' sampled tokens being `sampled` before each; (plan, the ids in the step inputs,
    the ring's `made`) of each (a Plan is good until the next take: its feed is taken at once)."""
    out = []
    for seed, (tokens, pairs) in enumerate(steps):
        arrays = _arrays(tokens, tokens, 8, seed)
        writer.publish(plan_record.encode(arrays, Feed.of(pairs)))
        inputs["step.tokens"][:len(sampled)] = sampled
        plan = taker.take(reader, len(sampled), timeout=5)
        out.append((plan.feed, inputs["step.ids"][:tokens].copy(), arrays["step.ids"], reader.made))
    return out


def test_a_native_take_applies_the_feed_of_a_plan_of_the_last_shape():
    """feeds=True (a host rank): a plan of the last plan's shape comes out of the take with its ids
    fed from the sampled tokens (its feed then None: nothing left to the step); a feed that reads
    past the tokens sampled, or writes past the plan's ids, is left to the step, decoded, which
    refuses it (generation/feed.py); a new shape is decoded in Python with its feed."""
    from radiance.collectives.ring import MADE_COPIES, MADE_FED
    from radiance.generation.feed import FeedError

    sampled = np.array([701, 702, 703], np.int32)
    with _native_plans() as (writer, reader, inputs, taker):
        steps = [(3, [(0, 2), (2, 0)]), (3, [(0, 1), (1, 0)]), (3, [(0, 1), (1, 0)]), (3, [(2, 1), (0, 0)]),
                 (3, [(0, 3), (1, 0)]), (3, [(0, 0), (1, 1)])]
        taken = _fed_steps(taker, writer, reader, inputs, steps, sampled)
        fed = MADE_COPIES | MADE_FED
        assert [made for *_, made in taken] == [0, fed, fed, fed, MADE_COPIES, fed]
        for (feed, ids, planned, made), (tokens, pairs) in zip(taken, steps):
            expected = planned.copy()
            if made == MADE_COPIES | MADE_FED:
                for target, source in pairs:
                    expected[target] = sampled[source]
                assert feed is None
            else:  # left to the step (a new shape, or a feed it refuses): the ids as planned, the feed on the plan
                assert feed == Feed.of(pairs)
            assert np.array_equal(ids, expected), (pairs, ids, expected)
        # the feed the take declined reads token 3 of 3 sampled: the step refuses it
        with pytest.raises(FeedError, match="a feed reads token 3 of a step that sampled 3"):
            taken[4][0].check(3, len(sampled))
        # one that writes past the ids (a target of 3 in a step of 3 ids), of the same shape: declined too
        writer.publish(plan_record.encode(_arrays(3, 3, 8), Feed.of([(3, 0), (0, 1)])))
        plan = taker.take(reader, 3, timeout=5)
        assert reader.made == MADE_COPIES and plan.feed == Feed.of([(3, 0), (0, 1)])
        # with nothing sampled before (the first step), no feed is applied either
        writer.publish(plan_record.encode(_arrays(3, 3, 8), Feed.of([(0, 0), (1, 0)])))
        plan = taker.take(reader, 0, timeout=5)
        assert reader.made == MADE_COPIES and plan.feed == Feed.of([(0, 0), (1, 0)])


def test_a_forged_plan_of_the_last_shape_reaches_no_step_input():
    """The take that would copy a plan of the last shape and apply its feed in C (feeds=True)
    refuses a record changed after it was signed before any copy: the step inputs keep the last
    plan's, the record is not consumed, and the refusal names the ring and the record."""
    from radiance.collectives.ring import SLOT_HEADER, RingError

    with _native_plans() as (writer, reader, inputs, taker):
        for seed in (0, 1):
            writer.publish(plan_record.encode(_arrays(2, 2, 8, seed), Feed.of([(0, 1)])))
            taker.take(reader, 2, timeout=5)
        assert reader.made == 3  # the shape repeats: the next take of it is the C call's copies
        before = {name: inputs[name].copy() for name in PLANNED}
        writer.publish(plan_record.encode(_arrays(2, 2, 8, seed=2), Feed.of([(0, 1)])))
        writer.slot(3)[SLOT_HEADER + plan_record.HEADER.size] ^= 1  # its first id, changed after the mac
        with pytest.raises(RingError, match="the plans ring: record 3 does not verify under the launch's secret"):
            taker.take(reader, 2, timeout=5)
        assert reader.made == 0 and reader.next == 3 and int(reader.consumed[0]) == 2
        for name in PLANNED:
            assert np.array_equal(inputs[name], before[name]), name
