"""libr4d's decode GEMV rows built from two versions of its C sources, timed alternately in one
process: the sources at a git revision (--base, default HEAD) against the working tree's, on the
shapes of SmolLM2-135M Q4_K_M's decode (its q5_0 q/k/v/o/gate/up, q4_k and q6_k ffn_down, q8_0
attn_v and head; q4_1 for the Q4_1 file), M = 1. Each round times both builds, in alternating order,
the best of --passes passes over --mb MB of distinct weight copies (cycled, so the weights stream
from memory as in a decode step rather than from one cached copy); the ratio printed is the median
of the rounds' base time / new time (above 1: the working tree is faster), with whether the two
builds' outputs are bit for bit the same.

    python bench/libr4d_ab.py [--base REV] [--threads 1] [--mb 40] [--rounds 10] [--formats q5_0 q4_k ...]

With --threads 1 the time is the launching thread's CPU time (time.thread_time), which another
process taking the core for a while does not inflate; with more threads it is wall time. On a
shared machine run it through bench/foreground.py.
"""

import argparse
import ctypes
import hashlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).parent))
from libr4d_kquants import weight  # noqa: E402

from radiance.abi import RAD_DT_ENCODED, RadArgs, RadTensor, rad_tensor  # noqa: E402
from radiance.engine.loading.registry import Registry  # noqa: E402

LIBR4D = Path(__file__).resolve().parent.parent / "plugins" / "kernels" / "libr4d"
# (format, rows, cols): SmolLM2-135M Q4_K_M's decode GEMVs (hidden 576, ffn 1536, 3 kv heads of 64)
SHAPES = (("q5_0", 1536, 576), ("q5_0", 576, 576), ("q5_0", 192, 576), ("q4_k", 576, 1536), ("q6_k", 576, 1536),
          ("q8_0", 192, 576), ("q8_0", 49152, 576), ("q4_1", 1536, 576))


def plugin_modules():
    """libr4d's native.py and rows modules as the registry loaded them (a plugin is not a package)"""
    base = next(m for m in sys.modules if m.startswith("_radiance_plugin_kernels_libr4d") and "." not in m)
    return sys.modules[base + ".native"], sys.modules[base + ".rows"], sys.modules[base + ".rows_kquants"]


def build(native, folder: Path, out: Path, threads: int):
    """libr4d built from the C sources in `folder` (native.py's flags), loaded"""
    sources = b"".join(p.read_bytes() for p in sorted(folder.glob("r4d*.[ch]")))
    path = out / f"r4d-{hashlib.sha256(sources).hexdigest()[:16]}.so"
    if not path.exists():
        cc, _ = native._compiler()
        command = [cc, *native.COMMON, "-O3", "-march=native", *native.prefetch_flags(), "-o", str(path),
                   *(str(folder / s.name) for s in native.SOURCES), "-lm"]
        subprocess.run(command, check=True, capture_output=True, text=True)
    lib = native.Native(ctypes.CDLL(str(path)), "native", path)
    lib.set_threads(threads)
    return lib


def sources_at(revision: str, out: Path) -> Path:
    """libr4d's C sources at a git revision, in out/base"""
    folder = out / "base"
    folder.mkdir()
    top = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=LIBR4D, check=True, capture_output=True,
                              text=True).stdout.strip())
    relative = LIBR4D.relative_to(top).as_posix()
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:{relative}"], cwd=top, check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        if name.startswith("r4d") and name.endswith((".c", ".h")):
            text = subprocess.run(["git", "show", f"{revision}:{relative}/{name}"], cwd=top, check=True,
                                  capture_output=True).stdout
            (folder / name).write_bytes(text)
    if not any(folder.glob("r4d*.c")):
        raise SystemExit(f"no libr4d sources at {revision}:{relative}")
    return folder


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="HEAD", help="the git revision whose sources are the base")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mb", type=float, default=40.0, help="MB of weight copies cycled per shape")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--formats", nargs="+", default=sorted({s[0] for s in SHAPES}))
    args = parser.parse_args()
    registry = Registry(radiance_home="", kernels="libr4d")
    native, rows, rows_kquants = plugin_modules()
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    try:
        with tempfile.TemporaryDirectory() as temporary:
            out = Path(temporary)
            libs = [build(native, sources_at(args.base, out), out, args.threads),
                    build(native, LIBR4D, out, args.threads)]
            print(f"libr4d {args.base} against the working tree, M = 1, {args.threads} thread(s), "
                  f"{args.mb:g} MB of copies a shape; base / new, median of {args.rounds} alternated rounds")
            rng = np.random.default_rng(0)
            for fmt, n, k in SHAPES:
                if fmt not in args.formats:
                    continue
                qtype = Q[fmt.upper()]
                first, nbytes = weight(qtype, n, k, rng)
                copies = max(1, min(400, int(args.mb * 1e6 / nbytes)))
                weights = [first] + [weight(qtype, n, k, rng)[0] for _ in range(copies - 1)]
                geometry = {"M": 1, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1, "aq": 16}
                x = rng.standard_normal((1, k)).astype(np.float32)
                outputs, runs = [], []
                for lib in libs:
                    plain = fmt in ("q8_0", "q4_1")
                    launch = rows._planned(lib, "r4d_gemv_p" if plain else "r4d_kq_gemv_p",
                                           (lambda op, a: rows._pack_gemv(op, a, 16)) if plain else
                                           (lambda op, a: rows_kquants._pack_gemv(op, a, 16)))
                    y = np.zeros((1, n), np.float32)
                    calls = [RadArgs(t=(rad_tensor(x), RadTensor(data=w, dtype=RAD_DT_ENCODED, ndim=2, shape=(n, k, 0, 0)),
                                        rad_tensor(y)), params=dict(geometry), scratch=None, scratch_bytes=0)
                             for w in weights]
                    for call in calls[:2]:
                        if launch(call) != 0:
                            raise SystemExit(f"{fmt} {n}x{k}: the launch failed")
                    outputs.append(y)
                    runs.append((launch, calls))
                seconds = [[], []]
                for round_ in range(args.rounds):
                    for i in (0, 1) if round_ % 2 == 0 else (1, 0):
                        launch, calls = runs[i]
                        best = float("inf")
                        for _ in range(args.passes):
                            start = clock()
                            for call in calls:
                                launch(call)
                            best = min(best, (clock() - start) / len(calls))
                        seconds[i].append(best)
                ratios = [b / a for b, a in zip(seconds[0], seconds[1])]
                same = "same bits" if np.array_equal(outputs[0], outputs[1]) else \
                    f"differ by {np.abs(outputs[0] - outputs[1]).max():.2e}"
                print(f"{fmt} {n:5d} x {k:4d} ({copies:3d} copies): base {statistics.median(seconds[0]) * 1e6:8.1f} µs, "
                      f"new {statistics.median(seconds[1]) * 1e6:8.1f} µs, base / new {statistics.median(ratios):.3f} "
                      f"({min(ratios):.2f}-{max(ratios):.2f}), {same}", flush=True)
    finally:
        registry.close()


if __name__ == "__main__":
    main()
