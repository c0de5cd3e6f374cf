"""What this card's memory moves at (issue 12's ceiling): the rates PyTorch's own kernels reach on one
H200, timed as the card benches time their peers (bench/torch_graph_time.py: captured in a CUDA
graph, the median of 10 replays), against the datasheet's 4.8 TB/s.

- read: a bf16 matrix of `--gib` GiB summed along its rows (the reduction reads every byte once and
  writes a vector), bytes read a second;
- copy: the same matrix copied into a second one, bytes read plus bytes written a second;
- gemv: torch.mv of the same bytes as a [rows, 4096] bf16 matrix (cuBLAS), bytes read a second,
  the shape of a decode step's weights.

So a decode step's bound at "the rate this card reaches" is its bytes over the best of these, beside
the datasheet's. Usage: python3 bench/card_memory_rate.py [--gib 4]"""

import argparse
import sys

from torch_graph_time import graph_ms, torch_or_none

DATASHEET = 4.8e12  # bytes a second, the H200's HBM3e


def rates(torch, gib: float) -> dict:
    columns = 4096
    rows = int(gib * 2**30 / (2 * columns))
    matrix = torch.randn(rows, columns, device="cuda", dtype=torch.bfloat16)
    into = torch.empty_like(matrix)
    vector = torch.randn(columns, device="cuda", dtype=torch.bfloat16)
    size = matrix.numel() * matrix.element_size()
    repeats = 4
    read = graph_ms(lambda: [matrix.sum(dim=1, dtype=torch.float32) for _ in range(repeats)], repeats)
    copy = graph_ms(lambda: [into.copy_(matrix) for _ in range(repeats)], repeats)
    gemv = graph_ms(lambda: [torch.mv(matrix, vector) for _ in range(repeats)], repeats)
    return {"read": size / (read * 1e-3), "copy": 2 * size / (copy * 1e-3), "gemv": size / (gemv * 1e-3),
            "bytes": size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=4.0, help="GiB of the bf16 matrix read")
    args = parser.parse_args()
    torch, version = torch_or_none()
    if torch is None or not torch.cuda.is_available():
        print(f"card_memory_rate: needs a card and PyTorch ({version})", file=sys.stderr)
        return 2
    found = rates(torch, args.gib)
    print(f"{torch.cuda.get_device_name()}, {version}, {found['bytes'] / 1e9:.2f} GB a pass")
    for name in ("read", "copy", "gemv"):
        print(f"  {name:5s} {found[name] / 1e12:5.2f} TB/s  ({found[name] / DATASHEET:.0%} of the datasheet's 4.8)")
    best = max(found["read"], found["gemv"])
    print(f"  the 8B bf16 decode step's 15.0 GB at the best read rate: {15.0e9 / best * 1e3:.2f} ms "
          f"(at 4.8 TB/s: {15.0e9 / DATASHEET * 1e3:.2f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
