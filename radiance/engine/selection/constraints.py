"""Whether one constraint holds, for an op's parameter, a band of its ranged extent, or a fact."""

from radiance.abi import RAD_C_DIV, RAD_C_EQ, RAD_C_GE, RAD_C_IN, RAD_C_LE, RadConstraint

SYMBOLS = {RAD_C_EQ: "==", RAD_C_LE: "<=", RAD_C_GE: ">=", RAD_C_DIV: "%", RAD_C_IN: "in"}
# A DIV or IN on the ranged extent holds for a band only when every value in it satisfies it;
# past this many values the band is treated as failing it rather than enumerated.
MAX_ENUMERATED = 4096


def describe(constraint: RadConstraint) -> str:
    if constraint.op == RAD_C_IN:
        return f"{constraint.key} in {{{constraint.sval}}}"
    if constraint.op == RAD_C_DIV:
        return f"{constraint.key} % {constraint.ival} == 0"
    wanted = constraint.sval if constraint.sval is not None else constraint.ival
    return f"{constraint.key} {SYMBOLS[constraint.op]} {wanted}"


def members(constraint: RadConstraint) -> set[str]:
    return set(constraint.sval.replace(",", " ").split())


def holds(constraint: RadConstraint, value) -> bool:
    op = constraint.op
    if op == RAD_C_EQ:
        if constraint.sval is not None:
            return str(value) == constraint.sval
        return isinstance(value, (int, float)) and value == constraint.ival
    if op == RAD_C_IN:
        return str(value) in members(constraint)
    if not isinstance(value, (int, float)):
        return False
    if op == RAD_C_LE:
        return value <= constraint.ival
    if op == RAD_C_GE:
        return value >= constraint.ival
    if op == RAD_C_DIV:
        return isinstance(value, int) and value % constraint.ival == 0
    return False


def holds_for_band(constraint: RadConstraint, lo: int, hi: int) -> bool:
    """Bands are cut at every LE/GE/EQ boundary, so those hold for all of a band or none of it."""
    if constraint.op in (RAD_C_LE, RAD_C_GE, RAD_C_EQ):
        return holds(constraint, lo) and holds(constraint, hi)
    if hi - lo >= MAX_ENUMERATED:
        return constraint.op == RAD_C_DIV and constraint.ival == 1
    return all(holds(constraint, value) for value in range(lo, hi + 1))


def band_starts(constraints, key: str, lo: int, hi: int) -> set[int]:
    """Where bands of `key` start, from every LE/GE/EQ boundary on it inside [lo, hi]."""
    starts = {lo}
    for constraint in constraints:
        if constraint.key != key or constraint.sval is not None:
            continue
        value = constraint.ival
        if constraint.op == RAD_C_LE:
            starts.add(value + 1)
        elif constraint.op == RAD_C_GE:
            starts.add(value)
        elif constraint.op == RAD_C_EQ:
            starts |= {value, value + 1}
    return {start for start in starts if lo <= start <= hi}
