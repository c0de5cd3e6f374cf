"""The search path: $RADIANCE_HOME (or --radiance-home) is homes separated by ':', the first
winning; the installed in-tree home comes last. An earlier home's plugin shadows a later one's of
the same name in the same kind folder."""

import os
from dataclasses import dataclass
from pathlib import Path

from radiance.abi import KIND_FOLDERS
from radiance.plugins import HOME as IN_TREE_HOME

PLUGIN_SUFFIXES = (".py", ".so")


@dataclass(frozen=True)
class Candidate:
    """A file or package folder in a home's kind folder, not yet loaded."""
    path: Path
    home: Path
    kind: int

    @property
    def name(self) -> str:
        """The name shadowing compares: the file name without its suffix."""
        return self.path.stem if self.path.is_file() else self.path.name


@dataclass(frozen=True)
class Shadowed:
    candidate: Candidate
    by: Candidate


def search_path(override: str | None = None) -> list[Path]:
    text = override if override is not None else os.environ.get("RADIANCE_HOME", "")
    homes = [Path(entry).expanduser().resolve() for entry in text.split(":") if entry]
    if IN_TREE_HOME not in homes:
        homes.append(IN_TREE_HOME)
    return list(dict.fromkeys(homes))


def _entries(folder: Path):
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(("_", ".")):
            continue
        if path.is_file() and path.suffix in PLUGIN_SUFFIXES:
            found.append(path)
        elif path.is_dir() and (path / "__init__.py").is_file():
            found.append(path)
    return found


def discover(homes: list[Path], kind: int) -> tuple[list[Candidate], list[Shadowed]]:
    """Every plugin of one kind on the search path, in search-path order, and the shadowed ones."""
    winners: dict[str, Candidate] = {}
    shadowed = []
    for home in homes:
        for path in _entries(home / KIND_FOLDERS[kind]):
            candidate = Candidate(path, home, kind)
            if candidate.name in winners:
                shadowed.append(Shadowed(candidate, winners[candidate.name]))
            else:
                winners[candidate.name] = candidate
    return list(winners.values()), shadowed
