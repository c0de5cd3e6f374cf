"""libref's ordered_dot against another version of it, in one process: SmolLM2's linears (30 layers
of q, k, v, o, gate, up, down) and its lm_head, at M rows, CPU seconds of each, alternating.
`--column-major`: this version is handed the weights stored column-major, as libref's relayout keeps
them for its multiplying rows (dense.relayout_columns); the other version gets them row-major.

    git show 96320ad:plugins/kernels/libref/ordered.py > /tmp/ordered_old.py
    python bench/foreground.py python bench/libref_dot.py /tmp/ordered_old.py [--rows 1 6] [--column-major]
"""

import argparse
import importlib.util
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # [N, K]
LAYERS, VOCAB, HIDDEN = 30, 49152, 576


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seconds(module, weights, inputs) -> float:
    start = time.process_time()
    for w, x in zip(weights, inputs):
        for _ in range(1 if w.shape[0] == VOCAB else LAYERS):
            module.ordered_dot(x, w)
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path, help="the other ordered.py")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 6], help="M: 1 a decode step, more a prefill")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--column-major", action="store_true", help="hand this version column-major weights")
    args = parser.parse_args()
    if not args.old.is_file():
        raise SystemExit(f"{args.old}: no such file")
    old, new = load(args.old, "ordered_old"), load(ROOT / "plugins" / "kernels" / "libref" / "ordered.py", "ordered_new")
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(shape).astype(np.float32) for shape in [*SHAPES, (VOCAB, HIDDEN)]]
    stored = [np.asfortranarray(w) for w in weights] if args.column_major else weights
    for rows in args.rows:
        inputs = [rng.standard_normal((rows, w.shape[1])).astype(np.float32) for w in weights]
        for w, s, x in zip(weights, stored, inputs):
            assert np.array_equal(old.ordered_dot(x, w), new.ordered_dot(x, s)), w.shape
        for _ in range(args.rounds):
            pairs = [(seconds(old, weights, inputs), seconds(new, stored, inputs)) for _ in range(2)]
            print(f"M = {rows}: " + "; ".join(f"old {a:.2f} s, new {b:.2f} s ({a / b:.2f}x)" for a, b in pairs))


if __name__ == "__main__":
    main()
