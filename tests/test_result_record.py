"""Rank 0's result record (collectives/result_record.py): tokens, figures and a tail of named arrays
round trip; a record of another kind, one shorter than its head says and tokens not int32 are
refused in one line."""

import numpy as np
import pytest

from radiance.collectives.result_record import FIGURES, ResultReader, ResultRecordError, ResultWriter, size
from radiance.collectives.ring_record import ops_arrays, pop_ops


def _figures(seed: int) -> dict:
    figures = {name: seed + 0.25 * i for i, name in enumerate(FIGURES)}
    figures["gate_holds"], figures["parts"] = seed + 3, 1
    return figures


def test_a_result_round_trips_with_and_without_a_tail():
    writer, reader = ResultWriter(), ResultReader()
    for seqs, profiled, returned in [(1, False, False), (3, True, False), (3, True, False), (5, False, True), (0, False, False)]:
        tokens = np.arange(100, 100 + seqs, dtype=np.int32)
        ops = {"gemv": 0.5 + seqs, "all_reduce": 0.25} if profiled else None
        extra = ops_arrays(ops)
        if returned:
            extra["hidden"] = np.linspace(0, 1, 2 * seqs, dtype=np.float32).reshape(seqs, 2)
        payload = writer.encode(tokens, _figures(seqs), extra)
        assert len(payload) == size(seqs, len(payload) - size(seqs))
        figures, got, tail = reader.decode(payload)
        assert figures == _figures(seqs) and type(figures["gate_holds"]) is int and type(figures["parts"]) is int
        assert got.dtype == np.int32 and np.array_equal(got, tokens)
        assert pop_ops(tail) == ops
        if returned:
            assert np.array_equal(tail.pop("hidden"), extra["hidden"])
        assert tail == {}


def test_a_record_that_is_no_result_or_is_short_is_refused():
    writer, reader = ResultWriter(), ResultReader()
    payload = writer.encode(np.int32([7, 8, 9]), _figures(1), ops_arrays({"gemv": 1.0}))
    with pytest.raises(ResultRecordError, match=r"result record: kind b'step', not b'rslt'"):
        reader.decode(b"step" + payload[4:])
    with pytest.raises(ResultRecordError, match=r"result record: \d+ bytes where its head \(3 tokens, a \d+-byte tail\)"):
        reader.decode(payload[:-1])
    with pytest.raises(ResultRecordError, match=r"result record: 10 bytes, short of its \d+-byte head"):
        reader.decode(payload[:10])
    with pytest.raises(ResultRecordError, match="result record: tokens are int64, not int32"):
        writer.encode(np.int64([7]), _figures(1))
