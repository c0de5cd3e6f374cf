"""The CPU a fresh Python process spends importing each console script's module (what `radiance --help`,
a CLI error, a rank process and the converter pay before their first line of work), against a bare
interpreter and `import numpy` timed in the same run, alternating, the median of `--rounds`.

    python bench/startup_imports.py [--rounds 7] [--modules radiance.tools.generate ...]

Each figure is user + system CPU of the whole process (`python -c "import MODULE"`), so the
interpreter's own start is in every line: the bare line is that floor. `--show ml_dtypes` etc. print
whether each module pulled the named heavy modules in.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

MODULES = ["radiance.tools.generate", "radiance.tools.launch", "radiance.convert.cli", "radiance.ranks.main",
           "radiance.tools.info", "radiance.tools.schemas", "radiance.tools.config"]
HEAVY = ["ml_dtypes", "jinja2", "gguf", "tqdm", "asyncio", "tokenizers", "yaml", "zmq"]


def cpu(code: str) -> float:
    """User + system CPU seconds of `python -c code` (its children waited for)."""
    before = os.times()
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--modules", nargs="+", default=MODULES)
    args = parser.parse_args()
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be 1 or more, not {args.rounds}")
    cases = {"(bare interpreter)": "pass", "numpy": "import numpy",
             **{module: f"import {module}" for module in args.modules}}
    seconds = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, code in cases.items():
            seconds[name].append(cpu(code))
    floor = statistics.median(seconds["(bare interpreter)"])
    for name, code in cases.items():
        median = statistics.median(seconds[name])
        heavy = ""
        if name in args.modules:
            probe = f"import sys, json; {code}; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
            pulled = json.loads(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                                               text=True).stdout)
            heavy = f"; imports {', '.join(pulled) or 'none of ' + ', '.join(HEAVY)}"
        print(f"{name:28s} {median:5.2f} s CPU ({median / floor:4.1f}x the bare interpreter){heavy}")


if __name__ == "__main__":
    main()
