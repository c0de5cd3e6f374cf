"""The engine's side of rad_plugin.h for C plugins: rad_plugin.c, built once with the machine's C
compiler and cached, then loaded with RTLD_GLOBAL before any .so plugin opens, so a plugin's
undefined rad_* symbols bind to it (as the specification's engine binary defines them). Its
rad_weight_f32 calls back into the engine's core decoder.

Built with `$CC` (default gcc) `-O2 -ffp-contract=off`, cached under `$XDG_CACHE_HOME/radiance/engine`
(else `~/.cache/radiance/engine`) by a hash of the source, the headers, the flags and the compiler's
version; written to a temporary file and renamed, so ranks starting together never see half a file.
Without a compiler the engine refuses every .so plugin with that reason and loads the rest.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from radiance.abi import HEADERS, HEADERS_DIR, RAD_E_INTERNAL, RAD_OK, RadWeightPlanes
from radiance.weights.decode import decode

from .c_structs import weight_from_c

SOURCE = Path(__file__).with_name("rad_plugin.c")
FLAGS = ["-std=gnu11", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-Wall"]
DECODE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(RadWeightPlanes.ctype), ctypes.POINTER(ctypes.c_float))


class HelpersUnavailable(RuntimeError):
    """rad_plugin.c could not be built or loaded; the message says why."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "radiance" / "engine"


def _compiler() -> tuple[str, str]:
    cc = os.environ.get("CC") or "gcc"
    path = shutil.which(cc)
    if path is None:
        raise HelpersUnavailable(f"no C compiler to build the engine's rad_plugin.h helpers: '{cc}' is not on "
                                 "PATH (set CC, or install gcc)")
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise HelpersUnavailable(f"'{cc} --version' failed: {error}") from None
    return path, (version.splitlines() or ["?"])[0]


def build() -> Path:
    cc, version = _compiler()
    key = hashlib.sha256()
    for part in [SOURCE.read_bytes(), *((HEADERS_DIR / h).read_bytes() for h in HEADERS), " ".join(FLAGS).encode(),
                 version.encode()]:
        key.update(part + b"\0")
    folder = cache_dir()
    target = folder / f"rad_plugin-{key.hexdigest()[:20]}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        command = [cc, *FLAGS, "-I", str(HEADERS_DIR), "-o", temporary, str(SOURCE), "-lm"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["?"])[-1]
            raise HelpersUnavailable(f"building the engine's rad_plugin.h helpers failed: {' '.join(command)}: {last}")
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target


@DECODE_FN
def _decode(c_weight, out):
    """rad_weight_f32: the core decoder over the planes a plugin hands back, into its f32 buffer."""
    try:
        encoding, planes, shape = weight_from_c(c_weight.contents)
        values = decode(encoding, planes, shape)
        np.ctypeslib.as_array(out, shape=(shape[0] * shape[1],))[:] = values.reshape(-1)
        return RAD_OK
    except Exception:  # noqa: BLE001 - an exception must not cross into C: the plugin sees a status
        return RAD_E_INTERNAL


_lock = threading.Lock()
_library: ctypes.CDLL | None = None


def helpers() -> ctypes.CDLL:
    """The helpers, built (or found in the cache) and loaded globally once per process."""
    global _library
    with _lock:
        if _library is None:
            try:
                library = ctypes.CDLL(str(build()), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
            except OSError as error:
                raise HelpersUnavailable(f"loading the engine's rad_plugin.h helpers failed: {error}") from None
            library.rad_engine_set_decoder.argtypes = [DECODE_FN]
            library.rad_engine_set_decoder(_decode)
            _library = library
        return _library
