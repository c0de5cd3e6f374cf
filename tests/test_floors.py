"""The floors: every folder stands on the folders below it and never imports one above it, so no
import runs up a floor and no two folders import each other, however indirectly.

The table of which folder stands on which is docs/LAYOUT.md's `floors` block, the one place it is
written. A folder may import what it stands on and everything below that; every import of every
module of the distribution is read (at the top of a file or inside a function alike) through
pyproject.toml's package-dir, which maps the top-level folders under `radiance.`. Imports inside
one folder are free."""

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ROOT / "docs" / "LAYOUT.md"


def package_dirs() -> dict[str, Path]:
    """Import prefix -> folder, from pyproject.toml: {"radiance.abi": ROOT / "abi", ...}."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {name: ROOT / folder for name, folder in config["tool"]["setuptools"]["package-dir"].items()}


def read_table(text: str) -> dict[str, list[str]]:
    """The `floors` block: one folder a line, `folder -> what it stands on, ...` (a folder standing
    on nothing of the tree has no arrow)."""
    block = re.search(r"^```floors\n(.*?)^```", text, re.S | re.M)
    if block is None:
        raise ValueError(f"{LAYOUT.relative_to(ROOT)}: no ```floors block")
    table = {}
    for number, line in enumerate(block.group(1).splitlines(), 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        folder, _, below = (part.strip() for part in line.partition("->"))
        if folder in table:
            raise ValueError(f"{LAYOUT.relative_to(ROOT)}: floors line {number}: '{folder}' twice")
        table[folder] = [name.strip() for name in below.split(",") if name.strip()]
    return table


def floors_of(table: dict[str, list[str]]) -> dict[str, int]:
    """Each folder's floor (1: stands on nothing of the tree); ValueError naming a circle."""
    floors: dict[str, int] = {}

    def floor(folder: str, path: tuple) -> int:
        if folder in path:
            raise ValueError("the table has a circle: " + " -> ".join(path[path.index(folder):] + (folder,)))
        if folder not in floors:
            floors[folder] = 1 + max((floor(below, path + (folder,)) for below in table[folder]), default=0)
        return floors[folder]

    for folder in table:
        floor(folder, ())
    return floors


def beneath(table: dict[str, list[str]], folder: str) -> set[str]:
    """Everything `folder` may import: what it stands on, and all below that."""
    seen, todo = set(), list(table[folder])
    while todo:
        below = todo.pop()
        if below not in seen:
            seen.add(below)
            todo += table[below]
    return seen


@dataclass(frozen=True)
class Import:
    path: str  # the importing file, from the checkout's root
    line: int
    name: str  # the module imported, as the import names it (relative ones made absolute)
    target: str  # the file of the tree it reaches, from the checkout's root


class Tree:
    """Every module of the distribution, by import name, and what each imports of the tree."""

    def __init__(self, dirs: dict[str, Path], root: Path = ROOT):
        self.dirs, self.root = dirs, root
        self.files: dict[str, Path] = {}  # module name -> file
        self.packages: set[str] = set()
        for prefix, folder in dirs.items():
            for path in folder.rglob("*.py"):
                name = self.module_name(path)
                if name is not None and "__pycache__" not in path.parts:
                    self.files.setdefault(name, path)
                    if path.name == "__init__.py":
                        self.packages.add(name)

    def module_name(self, path: Path) -> str | None:
        """The import name of a file: the longest package-dir folder holding it decides."""
        owners = [(prefix, folder) for prefix, folder in self.dirs.items() if path.is_relative_to(folder)]
        if not owners:
            return None
        prefix, folder = max(owners, key=lambda owner: len(owner[1].parts))
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join([prefix, *parts])

    def resolve(self, name: str) -> str | None:
        """The module of the tree that importing `name` runs last: the longest prefix that is one."""
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in self.files:
                return ".".join(parts[:end])
        return None

    def imports(self, name: str):
        path = self.files[name]
        package = name if name in self.packages else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from package import module` imports the module; `from module import name`, the module
                wanted = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in self.files else base
                          for alias in node.names]
            else:
                continue
            for wanted_name in dict.fromkeys(wanted):
                target = self.resolve(wanted_name) if wanted_name.startswith("radiance") else None
                if target is not None:
                    yield Import(self.relative(path), node.lineno, wanted_name, self.relative(self.files[target]))

    def relative(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()


def folder_of(table: dict, path: str) -> str | None:
    """The table's folder a file belongs to: the longest one holding it."""
    holders = [folder for folder in table if path.startswith(folder + "/")]
    return max(holders, key=len) if holders else None


@pytest.fixture(scope="module")
def table() -> dict[str, list[str]]:
    return read_table(LAYOUT.read_text())


@pytest.fixture(scope="module")
def tree() -> Tree:
    return Tree(package_dirs())


def test_the_table_names_every_top_level_folder_and_only_folders_that_exist(table):
    for folder in package_dirs().values():
        assert folder.relative_to(ROOT).as_posix() in table, f"docs/LAYOUT.md's floors lack {folder.name}/"
    for folder, below in table.items():
        for name in [folder, *below]:
            assert (ROOT / name).is_dir(), f"docs/LAYOUT.md's floors name {name}/, which is no folder"
            assert name in table, f"docs/LAYOUT.md's floors: {folder} stands on {name}, which has no line"


def test_the_table_has_floors_not_circles(table):
    floors = floors_of(table)  # raises, naming the circle
    assert floors["abi"] == 1, "the ABI stands on nothing of the engine"


def wrong_imports(table: dict, tree: Tree) -> list[str]:
    """Every import of a folder the importing one does not stand on, however indirectly: one line each."""
    wrong = []
    for name in sorted(tree.files):
        for found in tree.imports(name):
            mine, theirs = folder_of(table, found.path), folder_of(table, found.target)
            if mine != theirs and theirs not in beneath(table, mine):
                stands_on = ", ".join(table[mine]) or "nothing of the tree"
                wrong.append(f"{found.path}:{found.line}: imports {found.name} ({theirs}/), but {mine}/ stands on "
                             f"{stands_on} (docs/LAYOUT.md)")
    return wrong


def unused_arrows(table: dict, tree: Tree) -> list[str]:
    """The arrows of the table that no import takes."""
    used = {(folder_of(table, found.path), folder_of(table, found.target))
            for name in tree.files for found in tree.imports(name)}
    return [f"{folder} -> {below}" for folder, belows in table.items() for below in belows
            if (folder, below) not in used]


def test_no_import_runs_up_a_floor_or_closes_a_circle(table, tree):
    wrong = wrong_imports(table, tree)
    assert not wrong, "\n".join(wrong)


def test_every_arrow_of_the_table_is_an_import(table, tree):
    """The table says what is, not what might be: each folder imports each one it says it stands on."""
    unused = unused_arrows(table, tree)
    assert not unused, f"docs/LAYOUT.md's floors draw arrows no import takes: {', '.join(unused)}"


def test_the_drawing_in_the_doc_shows_each_folder_on_its_floor(table):
    block = re.search(r"^```drawing\n(.*?)^```", LAYOUT.read_text(), re.S | re.M)
    assert block, "docs/LAYOUT.md has no ```drawing block"
    floors, drawn, floor = floors_of(table), {}, None
    for line in block.group(1).splitlines():
        number, folder = re.match(r"^\s*(\d+)?\s+(\S+)", line).groups()
        floor = int(number) if number else floor
        drawn[folder] = floor
    assert drawn == floors


# ---- the reader itself, on a tree made here --------------------------------------------------------

def test_the_reader_maps_package_dirs_and_finds_an_import_up_a_floor_even_inside_a_function(tmp_path):
    for folder, text in {"core/__init__.py": "", "core/low.py": "def f():\n    from radiance.top import handler\n",
                         "core/mid.py": "from .low import x\n", "top/__init__.py": "",
                         "top/handler.py": "from radiance import low\n"}.items():
        (tmp_path / folder).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / folder).write_text(text)
    tree = Tree({"radiance": tmp_path / "core", "radiance.top": tmp_path / "top"}, tmp_path)
    found = {(f.path, f.target) for name in tree.files for f in tree.imports(name)}
    assert found == {("core/low.py", "top/handler.py"), ("core/mid.py", "core/low.py"),
                     ("top/handler.py", "core/low.py")}
    table = {"core": [], "top": ["core"]}
    assert beneath(table, "top") == {"core"} and beneath(table, "core") == set()
    assert folder_of(table, "core/low.py") == "core"
    assert wrong_imports(table, tree) == ["core/low.py:2: imports radiance.top.handler (top/), but core/ stands on "
                                          "nothing of the tree (docs/LAYOUT.md)"]
    assert unused_arrows({"core": [], "top": ["core"], "other": ["top"]}, tree) == ["other -> top"]
    with pytest.raises(ValueError, match="circle: core -> top -> core"):
        floors_of({"core": ["top"], "top": ["core"]})

