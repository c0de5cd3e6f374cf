"""The on-disk cache of compiled device code: source hash + target + compiler version (+ options)
-> code object bytes, under $RADIANCE_KERNEL_CACHE, else $XDG_CACHE_HOME/radiance/kernels, else
~/.cache/radiance/kernels.

An entry is `MAGIC | sha256(payload) | length | payload`. It is written to a temporary file in the
same folder and renamed into place, so a reader (another rank compiling the same source at the same
moment) sees either no entry or a whole one. An entry that fails its digest (a torn disk, a hand
edit) is counted as corrupt, compiled again and replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import tempfile
from pathlib import Path
from typing import Callable, Sequence

MAGIC = b"RADKC1\n"
HEADER = struct.Struct("<32sQ")  # payload digest, payload length


def default_root() -> Path:
    if os.environ.get("RADIANCE_KERNEL_CACHE"):
        return Path(os.environ["RADIANCE_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "radiance" / "kernels"


def cache_key(source: str | bytes, target: str, compiler: str, options: Sequence[str] = ()) -> str:
    source_bytes = source.encode() if isinstance(source, str) else bytes(source)
    ident = json.dumps([hashlib.sha256(source_bytes).hexdigest(), target, compiler, list(options)])
    return hashlib.sha256(ident.encode()).hexdigest()


class CompileCache:
    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_root()
        self.hits = self.misses = self.corrupt = 0
        self.last = ""  # "hit", "miss" or "corrupt": what the latest lookup found

    def path(self, key: str, target: str) -> Path:
        # The target names a folder; keep it to safe characters (gfx942:sramecc+:xnack- has ':').
        return self.root / re.sub(r"[^A-Za-z0-9_.+-]", "_", target) / f"{key}.bin"

    def load(self, path: Path) -> bytes | None:
        """The payload, or None (absent or corrupt: counted in self.last)."""
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            self.last = "miss"
            return None
        start = len(MAGIC) + HEADER.size
        if blob[:len(MAGIC)] == MAGIC and len(blob) >= start:
            digest, length = HEADER.unpack_from(blob, len(MAGIC))
            payload = blob[start:]
            if len(payload) == length and hashlib.sha256(payload).digest() == digest:
                self.last = "hit"
                return payload
        self.last = "corrupt"
        return None

    def store(self, path: Path, payload: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        blob = MAGIC + HEADER.pack(hashlib.sha256(payload).digest(), len(payload)) + payload
        fd, temporary = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(blob)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, path)  # atomic: readers see the old entry, none, or this one
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def get_or_compile(self, source: str | bytes, target: str, compiler: str, options: Sequence[str],
                       compile: Callable[[], bytes]) -> bytes:
        path = self.path(cache_key(source, target, compiler, options), target)
        payload = self.load(path)
        if payload is not None:
            self.hits += 1
            return payload
        if self.last == "corrupt":
            self.corrupt += 1
        else:
            self.misses += 1
        outcome = self.last
        payload = bytes(compile())
        try:
            self.store(path, payload)
        except OSError:
            pass  # a read-only or full cache costs a recompile next time, never the launch
        self.last = outcome
        return payload
