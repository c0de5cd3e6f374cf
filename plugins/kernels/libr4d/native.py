"""The compiled half of libr4d: r4d.c built at first load, cached on disk, loaded with ctypes.

Build: `$CC` (default gcc) with `-O3 -march=native -pthread -ffp-contract=off`; when that fails (an
old compiler, a machine where -march=native means nothing) a portable `-O2` build (plain C loops, no
intrinsics) is tried, with a warning naming the failed build (the portable one decodes several times
slower). `-march=native` is how the CPU in hand chooses its paths: the AVX-512 (VNNI)
GEMVs where it reports AVX-512 F/BW/VL, the AVX2/FMA ones otherwise; the prefill GEMMs (q8_0, and
the k-quants of one scale per 32) on AMX int8 tiles where it also reports AMX and the kernel grants
the tile state (r4d_gemm_amx.h). The library is cached under `$XDG_CACHE_HOME/radiance/libr4d`
(else `~/.cache/radiance/libr4d`) by a hash of the sources (r4d.c and the r4d_*.h it includes), the flags, the compiler's version and, for a native build, this CPU's
model and flags, so a cache folder shared between machines never hands one CPU another's code. A build writes a temporary file and
renames it, so ranks starting together at most compile twice and never see half a file.

Knobs (read when the plugin opens):
  RADIANCE_THREADS      threads per launch, the calling thread included (else OMP_NUM_THREADS, else
                        the CPUs this process may use); `radiance --threads N` sets it
  RADIANCE_R4D_NATIVE   0: do not build; every row runs its numpy fallback
  RADIANCE_R4D_ISA      portable: skip the native build (what a CPU without AVX2 gets)
  RADIANCE_R4D_MARCH    the -march of the native build (default native; haswell builds the AVX2
                        paths without VNNI or AVX-512, what an older CPU gets)
  RADIANCE_R4D_AQ       the decode GEMV's activations: 16 (default), 8 or 0 (rows.py)
  CC                    the compiler

Operands reach C as array heads shaped like numpy's PyArrayObject head (data, nd, dims, strides):
`Header`, filled once per launch plan from the numpy array (rows.py), so r4d.c never depends on
numpy's own object layout.
"""

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

SOURCE = Path(__file__).with_name("r4d.c")
# r4d.c (which includes its r4d_*.h headers), the GGUF block types' rows (r4d_kquants.c) and Gemma 3's
# ops (r4d_gemma.c) build into one library, with the broadcast ring's slot copy and mac check
SOURCES = (SOURCE, SOURCE.with_name("r4d_kquants.c"), SOURCE.with_name("r4d_gemma.c"),
           SOURCE.with_name("r4d_ring.c"))  # r4d_ring.c: a broadcast-ring slot's copy and mac (collectives/ring.py)
HEADERS = sorted(Path(__file__).parent.glob("r4d_*.h"))  # part of the build's key
log = logging.getLogger("radiance.libr4d")

COMMON = ["-std=gnu11", "-fPIC", "-shared", "-pthread", "-ffp-contract=off", "-fno-strict-aliasing"]


def variants(march: str):
    """(name, flags) to try in order: the target's build, then portable C."""
    return (("native", ["-O3", f"-march={march}", *prefetch_flags()]), ("portable", ["-O2"]))


def prefetch_flags() -> list[str]:
    """The GEMVs' prefetch hint for this CPU's vendor (r4d.c, R4D_PF_HINT): non-temporal on AMD,
    where it was measured best, T0 elsewhere (on Intel NTA halved the streaming rate)."""
    return ["-DR4D_PF_HINT=_MM_HINT_NTA"] if "AuthenticAMD" in _cpu_signature() else []


# r4d_isa() bits (AMX: its int8 tiles built in and granted to this process by the kernel)
ISA_AVX2, ISA_VNNI, ISA_AVX512, ISA_AMX = 1, 2, 4, 8

_P, _I64, _I, _D = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_double
SIGNATURES = {
    "r4d_set_threads": ([_I], _I),
    "r4d_threads": ([], _I),
    "r4d_isa": ([], _I),
    "r4d_embedding": ([_P, _I, _P, _P, _P, _I64, _I64, _P, _I64], _I),
    "r4d_gemv": ([_P, _I, _P, _P, _P, _P, _I64, _I64, _I64, _I], _I),
    "r4d_gemm": ([_P, _I, _P, _P, _P, _P, _I64, _I64, _I64, _I], _I),
    "r4d_rmsnorm": ([_P, _P, _P, _I64, _I64, _D], _I),
    "r4d_add": ([_P, _P, _P, _I64, _I64], _I),
    "r4d_silu_mul": ([_P, _P, _P, _I64, _I64], _I),
    "r4d_take_rows": ([_P, _P, _P, _I64, _I64], _I),
    "r4d_rope": ([_P, _P, _P, _P, _I64, _I64, _I64, _I64, _I], _I),
    "r4d_attention": ([_P] * 11 + [_I64] * 5 + [_D], _I),
    "r4d_argsort_desc": ([_P, _I64, _P], _I),
    "r4d_add_rmsnorm": ([_P, _P, _P, _P, _I64, _I64, _D], _I),
    "r4d_wait_word": ([_P, ctypes.c_uint64, _I64, _I64, _I64], _I),
    "r4d_wake_word": ([_P], None),
    "r4d_ring_take_p": ([_P], _I64),
    "r4d_blake2b_keyed": ([_P, ctypes.c_char_p, _I64, ctypes.c_char_p, _I64], _I),
}


# one packed int64 argument (rows.py prepares it once per RadArgs); no argtypes: the call takes a
# prebuilt c_void_p, the cheapest argument ctypes passes
PACKED = ("r4d_embedding_p", "r4d_gemv_p", "r4d_gemm_p", "r4d_rmsnorm_p", "r4d_add_p", "r4d_silu_mul_p",
          "r4d_take_rows_p", "r4d_rope_p", "r4d_attention_p", "r4d_add_rmsnorm_p", "r4d_kq_gemm_p",
          "r4d_kq_embedding_p", "r4d_kq_gemv_p", "r4d_sliding_attention_p", "r4d_scale_p", "r4d_gelu_tanh_mul_p",
          "r4d_kq_rmsnorm_gemm2_silu_mul_p", "r4d_kq_gemv_add_p", "r4d_kq_rmsnorm_gemm2_p")


class NativeUnavailable(RuntimeError):
    """No variant of r4d.c could be built or loaded; the message says why."""


def threads_from_env() -> int:
    for key in ("RADIANCE_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(key, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "radiance" / "libr4d"


def _cpu_signature() -> str:
    text = platform.machine() + platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            seen = set()
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("vendor_id", "model name", "flags", "Features", "CPU part") and key not in seen:
                    seen.add(key)
                    text += line
    except OSError:
        pass
    return text


def _compiler() -> tuple[str, str]:
    cc = os.environ.get("CC") or "gcc"
    path = shutil.which(cc)
    if path is None:
        raise NativeUnavailable(f"no C compiler: '{cc}' is not on PATH (set CC, or install gcc)")
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as error:
        raise NativeUnavailable(f"'{cc} --version' failed: {error}") from None
    return path, version.splitlines()[0] if version else "?"


def _build(variant: str, flags: list[str], cc: str, version: str, folder: Path) -> Path:
    sources = b"\0".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    key = hashlib.sha256()
    for part in (sources, " ".join(COMMON + flags).encode(), version.encode(), platform.machine().encode()):
        key.update(part + b"\0")
    if "-march=native" in flags:
        key.update(_cpu_signature().encode())
    target = folder / f"r4d-{variant}-{key.hexdigest()[:20]}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        command = [cc, *COMMON, *flags, "-o", temporary, *map(str, SOURCES), "-lm"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["?"])[-1]
            raise NativeUnavailable(f"{variant} build failed: {' '.join(command)}: {last}")
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target


class Header(ctypes.Structure):
    """A PyArrayObject head with its dims and strides inline: what a launch plan hands r4d.c for an
    operand, copied once (a numpy array never moves its data while referenced). The headers of one
    launch sit side by side, so r4d.c reads a line or two instead of chasing every array's head."""
    # dims and strides are int64_t * on the C side; held as addresses here (no ctypes.cast per fill:
    # a new shape's first step fills a header for every operand of every launch)
    _fields_ = [("refcnt", ctypes.c_ssize_t), ("type", ctypes.c_void_p), ("data", ctypes.c_void_p),
                ("nd", ctypes.c_int), ("dims", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("dim", ctypes.c_int64 * 4), ("stride", ctypes.c_int64 * 4)]

    def fill(self, array):
        if array.ndim > 4:
            raise ValueError(f"an operand of {array.ndim} dimensions")
        interface = array.__array_interface__
        self.refcnt, self.data, self.nd = 1, interface["data"][0], array.ndim
        self.dim[:array.ndim], self.stride[:array.ndim] = array.shape, array.strides
        address = ctypes.addressof(self)
        self.dims, self.strides = address + _DIM_OFFSET, address + _STRIDE_OFFSET


_DIM_OFFSET, _STRIDE_OFFSET = Header.dim.offset, Header.stride.offset


class Native:
    """The loaded library: `lib` (ctypes functions), `isa`, `variant`, `path`, `threads`, and
    `Header`, the operand head its functions take."""

    def __init__(self, lib, variant: str, path: Path):
        self.lib, self.variant, self.path = lib, variant, path
        for name, (args, result) in SIGNATURES.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = args, result
        for name in PACKED:
            getattr(lib, name).restype = ctypes.c_int
        self.isa = lib.r4d_isa()
        self.threads = lib.r4d_set_threads(threads_from_env())
        self.Header = Header

    def set_threads(self, n: int) -> int:
        self.threads = self.lib.r4d_set_threads(int(n))
        return self.threads

    def describe(self) -> str:
        names = ((ISA_AVX2, "avx2+fma"), (ISA_AVX512, "avx512"), (ISA_VNNI, "vnni"), (ISA_AMX, "amx"))
        isa = [name for bit, name in names if self.isa & bit]
        if not self.isa & ISA_AVX2:
            isa.insert(0, "portable C")
        return f"{self.variant} build ({', '.join(isa)}), {self.threads} thread(s), {self.path}"


# rad-avx-check's ISA levels (libr4d's avx_isa_force): portable C, the AVX2/FMA paths, this CPU's best
ISA_LEVELS = (("portable", ["-O2"]), ("avx2", ["-O3", "-march=haswell"]), ("native", ["-O3", "-march=native"]))


def load_level(level: int) -> Native:
    """The build of ISA level `level` (an index of ISA_LEVELS); NativeUnavailable for a level this CPU
    does not run or that will not build."""
    if not 0 <= level < len(ISA_LEVELS):
        raise NativeUnavailable(f"no ISA level {level}")
    variant, flags = ISA_LEVELS[level]
    if variant == "avx2" and not {"avx2", "fma", "f16c"} <= set(_cpu_signature().split()):
        raise NativeUnavailable("this CPU has no AVX2, FMA and F16C")
    cc, version = _compiler()
    path = _build(variant, flags + (prefetch_flags() if level else []), cc, version, cache_dir())
    return Native(ctypes.CDLL(str(path)), variant, path)


def load() -> Native:
    """Build (or find in the cache) and load the best variant that works here."""
    if os.environ.get("RADIANCE_R4D_NATIVE", "1").strip() == "0":
        raise NativeUnavailable("RADIANCE_R4D_NATIVE=0")
    cc, version = _compiler()
    portable_only = os.environ.get("RADIANCE_R4D_ISA", "").strip().lower() == "portable"
    march = os.environ.get("RADIANCE_R4D_MARCH", "native").strip() or "native"
    folder, failures = cache_dir(), []
    for variant, flags in variants(march):
        if portable_only and variant.startswith("native"):
            continue
        try:
            path = _build(variant, flags, cc, version, folder)
            loaded = Native(ctypes.CDLL(str(path)), variant, path)
        except (NativeUnavailable, OSError, subprocess.SubprocessError) as error:
            failures.append(str(error))
            continue
        if failures:  # a build that failed is said where it happens: the one loaded runs several times slower
            log.warning("libr4d: %s; running the %s build instead", "; ".join(failures), variant)
        return loaded
    raise NativeUnavailable("; ".join(failures))
