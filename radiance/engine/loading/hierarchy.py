"""The kernel hierarchy: --kernels / $RADIANCE_KERNELS entries first, in their order; then every
other library found, in search-path order; reference libraries last. Between libraries the order
is absolute: the first with any matching row supplies the op."""

import os
from pathlib import Path

from .records import Plugin


def parse_kernels(text: str | None) -> list[str]:
    text = text if text is not None else os.environ.get("RADIANCE_KERNELS", "")
    return [entry.strip() for entry in text.split(",") if entry.strip()]


def entry_matches(entry: str, path: Path, name: str) -> bool:
    """An entry matches a plugin's name, its file (`libr4d`, `r4d`, `libr4d.py`) or a path."""
    stem = path.stem if path.suffix else path.name
    forms = {name, stem, path.name, name.removeprefix("lib"), stem.removeprefix("lib")}
    if entry in forms:
        return True
    if "/" in entry or entry.startswith("."):
        return Path(entry).expanduser().resolve() == path.resolve()
    return False


def order_libraries(libraries: list[Plugin], entries: list[str]) -> tuple[list[Plugin], list[str]]:
    """The hierarchy, and the entries that matched no library."""
    named, unmatched = [], []
    for entry in entries:
        matches = [lib for lib in libraries if entry_matches(entry, lib.path, lib.name)]
        if not matches:
            unmatched.append(entry)
        named += [lib for lib in matches if lib not in named]
    rest = [lib for lib in libraries if lib not in named]
    return named + [lib for lib in rest if not lib.reference] + [lib for lib in rest if lib.reference], unmatched
