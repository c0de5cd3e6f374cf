"""Overlap of concurrent rows. A row marked rad_kernel_concurrent touches only its operands and
scratch, so it may run beside an independent neighbour (on the host, a worker thread; the C and
numpy kernels release the GIL). Two launches are independent when neither writes what the other
reads or writes. A row not so marked never overlaps anything."""

from concurrent.futures import ThreadPoolExecutor

from radiance.abi import RAD_OPD_INOUT, RAD_OPD_OUT

from radiance.engine.selection.resolve import Launch


def _accesses(launch: Launch) -> tuple[set, set]:
    reads, writes = set(), set()
    for spec, name in zip(launch.schema.operands, launch.node.operands):
        if not name:
            continue
        (writes if spec.role in (RAD_OPD_OUT, RAD_OPD_INOUT) else reads).add(name)
        if spec.role == RAD_OPD_INOUT:
            reads.add(name)
    return reads, writes


def independent(a: Launch, b: Launch) -> bool:
    reads_a, writes_a = _accesses(a)
    reads_b, writes_b = _accesses(b)
    return not (writes_a & (reads_b | writes_b) or writes_b & reads_a)


def runs(launches: list[Launch]) -> list[tuple[int, int]]:
    """The step cut into (first index, count) runs: consecutive concurrent rows, each independent
    of every other in its run, run together; every other launch alone. Worked out once per step shape."""
    out, index = [], 0
    while index < len(launches):
        end = index + 1
        if launches[index].band.row.concurrent:
            while (end < len(launches) and launches[end].band.row.concurrent
                   and all(independent(launches[j], launches[end]) for j in range(index, end))):
                end += 1
        out.append((index, end - index))
        index = end
    return out


class Overlap:
    """The pool concurrent runs go to."""

    def __init__(self, workers: int = 2):
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rad-concurrent")

    def close(self) -> None:
        self.pool.shutdown(wait=True)
