"""The largest step a graph's rows serve, from the parameter roles of their ops' schemas:

- `RAD_PROLE_SEQ_CHUNK` marks the parameter the scheduler cuts steps on (docs/OPS.md: each op's
  `M`). Where no library serves the top of a node's range (the rows say `M <= 64` and nothing
  serves above), the step is cut at the largest extent served from 1 up, rather than the graph
  refused: the scheduler never plans a step past it. A hole lower down is still an error.
- `RAD_PROLE_CAPACITY` marks a count a kernel only bounds itself by (attention's `seqs`: the
  sequences of a step). The engine hands it the step's bound as a parameter, so a row's
  constraint on it (`seqs <= 8`) is judged against what the step can hold and the row can size
  from it; where no row serves that bound, the bound is lowered to the largest one a row accepts
  and the scheduler admits no more sequences to a step than that.

Both limits are per extent kind (RAD_EXTENT_TOKENS: tokens of a step; RAD_EXTENT_SEQS: sequences),
the minimum over the graph's nodes; the scheduler takes them (generation/scheduler.py)."""

from dataclasses import dataclass, field

from radiance.abi import (
    RAD_C_EQ, RAD_C_GE, RAD_C_LE, RAD_EXTENT_SEQS, RAD_EXTENT_TOKENS, RAD_PROLE_CAPACITY, RAD_PROLE_SEQ_CHUNK,
    RadOpSchema,
)

# The capacity counts the engine knows how to bound, by parameter name: the vocabulary has one.
CAPACITY_EXTENTS = {"seqs": RAD_EXTENT_SEQS}
EXTENT_NAMES = {RAD_EXTENT_TOKENS: "tokens", RAD_EXTENT_SEQS: "sequences"}


@dataclass
class StepLimits:
    """The largest extent of each kind a step may have; `notes` say where one was lowered and why."""
    extents: dict  # RAD_EXTENT_* -> the largest value
    notes: list = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return self.extents[RAD_EXTENT_TOKENS]

    @property
    def seqs(self) -> int:
        return self.extents[RAD_EXTENT_SEQS]

    def lower(self, kind: int, value: int, why: str) -> None:
        if value < self.extents[kind]:
            self.extents[kind] = value
            self.notes.append(why)


def seq_chunk_param(schema: RadOpSchema) -> str | None:
    """The ranged extent's name where its role is seq_chunk (the scheduler may cut on it), else None."""
    ranged = schema.params[0]
    return ranged.name if ranged.role == RAD_PROLE_SEQ_CHUNK else None


def capacity_params(schema: RadOpSchema) -> list[str]:
    """The op's capacity parameters the engine can bound (CAPACITY_EXTENTS)."""
    return [p.name for p in schema.params if p.role == RAD_PROLE_CAPACITY and p.name in CAPACITY_EXTENTS]


def lower_bounds(rows, key: str, above: int) -> list[int]:
    """The values of `key` below `above` where some row's range of it ends, largest first: a cut
    there is the largest a row could serve (LE and EQ end at their value, GE just before it)."""
    ends = set()
    for row in rows:
        for constraint in row.info.constraints:
            if constraint.key != key or constraint.sval is not None:
                continue
            end = constraint.ival - 1 if constraint.op == RAD_C_GE else constraint.ival
            if constraint.op in (RAD_C_LE, RAD_C_EQ, RAD_C_GE) and 1 <= end < above:
                ends.add(end)
    return sorted(ends, reverse=True)
