"""The product's bytecode, compiled once before the tests start their processes (holds no tests).

Where PYTHONDONTWRITEBYTECODE is set (as on the shared test machine), no Python process writes a
.pyc, so every process the suite starts (rank processes, launchers, CLI runs: hundreds) compiled
each radiance module it imports from source: about 0.2 s of CPU a process. Compiling the tested
radiance's own folders here, as an install would have, lets them all read the bytecode; the
processes still write nothing, and a source edited later is compiled in memory as before (a .pyc
is checked against its source's size and time). Nothing is compiled where Python writes bytecode
itself, or where the install's folders are not writable (a wheel's are compiled when installed)."""

import compileall
import importlib.util
import os
import sys

# the import packages whose folders pyproject.toml maps (an editable install's source folders)
PACKAGES = ("radiance", "radiance.abi", "radiance.ranks", "radiance.collectives", "radiance.launch",
            "radiance.plugins")


def folders() -> list[str]:
    """The source folders of the radiance under test, each once."""
    found = []
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        found += [folder for folder in (spec.submodule_search_locations or []) if folder not in found]
    return found


def compile_product() -> None:
    if not (sys.flags.dont_write_bytecode or os.environ.get("PYTHONDONTWRITEBYTECODE")):
        return
    for folder in folders():
        if os.access(folder, os.W_OK):
            compileall.compile_dir(folder, quiet=1, workers=1)
