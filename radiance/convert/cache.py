"""A GGUF file straight in, as llama.cpp users expect: `radiance --model model.gguf` converts it once
into a cache keyed by the file's content and maps the .rad from there every later time.

The key is the SHA-256 of the file's bytes (read once, with a progress bar; a small index remembers
it by device, inode, size and modification time, so an unchanged file is not read again) and the
converter's version, which changes whenever the same file would convert to other bytes. The
conversion runs under a lock on the cache entry, so two commands given the same file at once convert
it once; it writes `<key>.rad.partial` and renames, so a cache entry is always whole. The cache is
$RADIANCE_CACHE, else $XDG_CACHE_HOME/radiance, else ~/.cache/radiance; its GGUF entries are in
`gguf/`. A file the converter refuses raises its ConvertError, the one line rad-convert prints."""

import fcntl
import hashlib
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from radiance.log import get_logger

# Bump when the same GGUF file would convert to other bytes (the importer, an encoding, a family's names).
CONVERTER_VERSION = 1
CHUNK = 1 << 22
GGUF_MAGIC = b"GGUF"
log = get_logger("radiance.convert")


def cache_dir() -> Path:
    """Where converted GGUF files are kept."""
    root = os.environ.get("RADIANCE_CACHE")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        root = Path(base) / "radiance"
    return Path(root) / "gguf"


def _stat_key(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_dev}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}"


def _index(folder: Path) -> dict:
    try:
        index = json.loads((folder / "index.json").read_text())
        return index if isinstance(index, dict) else {}
    except (OSError, ValueError):
        return {}


def _remember(folder: Path, key: str, digest: str) -> None:
    """Add one entry to the index; written whole and renamed, so a reader never sees half of it."""
    index = _index(folder)
    index[key] = digest
    temporary = folder / f"index.json.{os.getpid()}"
    temporary.write_text(json.dumps(index, indent=0, sort_keys=True))
    temporary.replace(folder / "index.json")


def content_digest(path: Path, folder: Path, progress: bool = True) -> str:
    """SHA-256 of the file's bytes, remembered by its stat so an unchanged file is read once."""
    key = _stat_key(path)
    known = _index(folder).get(key)
    if known:
        return known
    from tqdm import tqdm  # here, not at import: it reads package metadata (0.1-0.2 s a process)

    digest = hashlib.sha256()
    with open(path, "rb") as file, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, file=sys.stderr,
                                        disable=None if progress else True, desc=f"hashing {path.name}") as bar:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    _remember(folder, key, digest.hexdigest())
    return digest.hexdigest()


@contextmanager
def _locked(lock: Path):
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cached_rad(path, radiance_home=None, progress: bool = True) -> Path:
    """The .rad of a GGUF file, converted into the cache the first time (ConvertError: the
    converter's one line for a damaged or unsupported file)."""
    path = Path(path)
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{content_digest(path, folder, progress)}-c{CONVERTER_VERSION}.rad"
    if target.is_file():
        return target
    from .api import convert  # the importers and their dependencies only when there is work for them

    with _locked(folder / f"{target.name}.lock"):
        if not target.is_file():  # another command may have converted it while this one waited
            log.info("converting %s once into the cache: %s", path, target)
            convert(path, target, radiance_home=radiance_home, progress=f"converting {path.name}")
    return target


def is_gguf(path) -> bool:
    """Whether `path` is a file that starts as a GGUF file does."""
    path = Path(path)
    if not path.is_file():
        return False
    with open(path, "rb") as file:
        return file.read(len(GGUF_MAGIC)) == GGUF_MAGIC


def model_file(model, radiance_home=None, progress: bool = True) -> str:
    """What --model names, as a file the engine maps: a .rad as it is, a GGUF file through the cache."""
    if is_gguf(model):
        return str(cached_rad(model, radiance_home, progress))
    return os.fspath(model)
