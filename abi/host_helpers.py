"""Native helpers a plugin offers the runtime, by name: a kernel library built from C hands over
functions the runtime's own modules would otherwise run in Python, and those modules take them
from here, neither importing the other (docs/LAYOUT.md: plugins and collectives both stand on abi).

    ring_take   collectives/ring.py's slot copy and check: libr4d's r4d_ring_take_p (r4d_ring.c)

A module takes what is offered when it makes the object that uses it (a ring, when it is created
or attached), so what a plugin offers after that changes nothing already made."""

_offered: dict = {}


def offer(name: str, function) -> None:
    """`function` as the helper `name`; None withdraws it (the runtime's Python way again)."""
    if function is None:
        _offered.pop(name, None)
    else:
        _offered[name] = function


def offered(name: str):
    """The helper `name` a plugin offered, or None."""
    return _offered.get(name)
