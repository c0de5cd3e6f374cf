"""Overlap of concurrent rows. A row marked rad_kernel_concurrent touches only its operands and
scratch, so it may run beside an independent neighbour (on the host, a worker thread; the C and
numpy kernels release the GIL). Two nodes are independent when neither writes what the other
reads or writes. A row not so marked never overlaps anything."""

from concurrent.futures import ThreadPoolExecutor

from radiance.abi import RAD_OPD_INOUT, RAD_OPD_OUT

from .resolve import ResolvedNode


def _accesses(item: ResolvedNode) -> tuple[set, set]:
    reads, writes = set(), set()
    for spec, name in zip(item.schema.operands, item.node.operands):
        if not name:
            continue
        (writes if spec.role in (RAD_OPD_OUT, RAD_OPD_INOUT) else reads).add(name)
        if spec.role == RAD_OPD_INOUT:
            reads.add(name)
    return reads, writes


def independent(a: ResolvedNode, b: ResolvedNode) -> bool:
    reads_a, writes_a = _accesses(a)
    reads_b, writes_b = _accesses(b)
    return not (writes_a & (reads_b | writes_b) or writes_b & reads_a)


class Overlap:
    """Which runs of consecutive nodes may overlap, worked out once; a pool to run them on."""

    def __init__(self, resolved: list[ResolvedNode], workers: int = 2):
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rad-concurrent")
        # may_join[i]: node i is independent of every node of the run that ends just before it
        self.may_join = [False] * len(resolved)
        start = 0
        for i in range(1, len(resolved)):
            if all(independent(resolved[j], resolved[i]) for j in range(start, i)):
                self.may_join[i] = True
            else:
                start = i

    def group(self, resolved, rows, index: int) -> int:
        """How many nodes from `index` on may run together, given the rows this step chose."""
        if not rows[index].concurrent:
            return 1
        end = index + 1
        while end < len(resolved) and self.may_join[end] and rows[end].concurrent:
            end += 1
        return end - index

    def close(self) -> None:
        self.pool.shutdown(wait=True)
