"""A function of a module in tests/ run in a Python process of its own, its value pickled back: what an
early build (tests/early_builds.py) runs when its work is Python, so that it takes the second core
beside the tests rather than this process's interpreter lock (holds no tests)."""

import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import early_builds

TESTS = Path(__file__).resolve().parent

# argv: the tests folder, the pickled (module, function, arguments) in hex, the file for the value
RUNNER = """import importlib, pickle, sys
sys.path.insert(0, sys.argv[1])
module, function, arguments = pickle.loads(bytes.fromhex(sys.argv[2]))
value = getattr(importlib.import_module(module), function)(*arguments)
with open(sys.argv[3], "wb") as out:
    pickle.dump(value, out)
"""


def call(module: str, function: str, *arguments):
    """`module.function(*arguments)` in a new interpreter (from this one's working folder, as pytest
    runs), the arguments and the value picklable; its error, with its output, as an AssertionError."""
    with tempfile.TemporaryDirectory(prefix="radiance-in-subprocess-") as folder:
        out = Path(folder) / "value.pickle"
        result = subprocess.run([sys.executable, "-c", RUNNER, str(TESTS),
                                 pickle.dumps((module, function, arguments)).hex(), str(out)],
                                capture_output=True, text=True, env=early_builds.environment())
        assert result.returncode == 0, f"{module}.{function} in a process of its own:\n{result.stdout}{result.stderr[-3000:]}"
        return pickle.loads(out.read_bytes())
