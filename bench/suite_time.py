"""The test suite's wall time, on this machine as it is or with N processes spinning beside it.

    python bench/suite_time.py [--busy N] [--python PYTHON] [--tree PATH] [--log FILE] [-- PYTEST ARGS]

Runs `PYTHON -m pytest -q` (default: this Python, `-q` and nothing else) in `--tree` (default: this
checkout), with `--busy N` spinning processes started before and stopped after, and prints the wall
time, pytest's last line, the CPU seconds the run took (pytest and the processes it waited for), and
the CPU that other processes took meanwhile (what makes a quiet figure not quiet); `--log` keeps
pytest's whole output (with `-- --durations=80`, the slowest tests). Pointing `--python` and `--tree` at another checkout's environment times that one, so a
before and an after can be run one after the other.
"""

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from generate_tp1 import Others, start_busy, stop_busy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=0, help="processes spinning throughout")
    parser.add_argument("--python", default=sys.executable, help="the Python whose radiance is tested")
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent, help="the checkout")
    parser.add_argument("--log", type=Path, help="a file for pytest's whole output")
    parser.add_argument("pytest", nargs="*", help="pytest's arguments (after --)")
    args = parser.parse_args()
    if args.busy < 0:
        raise SystemExit(f"--busy must be 0 or more, not {args.busy}")
    spinners = start_busy(args.busy)
    others = Others(spinners)
    try:
        with others:
            start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            result = subprocess.run([args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest],
                                    cwd=args.tree, capture_output=True, text=True)
            wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    finally:
        stop_busy(spinners)
    lines = result.stdout.strip().splitlines() + result.stderr.strip().splitlines()
    summary = next((line for line in reversed(lines) if " in " in line and ("passed" in line or "failed" in line
                                                                             or "error" in line)), "no summary")
    if args.log:
        args.log.write_text(result.stdout + result.stderr)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"{args.tree} ({args.python}), {args.busy} busy: {wall:.0f} s wall, {cpu:.0f} s CPU; {summary}; "
          f"{others.line()}")
    if result.returncode:
        print("\n".join(lines[-40:]))


if __name__ == "__main__":
    sys.exit(main())
