"""How libr4d gets its kernels: the native build cached by source hash, the portable C build, the
numpy fallback where no compiler is found, the thread knob. Each variant's rows agree with libref.

The variants' compiles (half a minute each) are early builds (tests/early_builds.py): libr4d opened
with the variant's knobs, its cache a folder of the early builds', in a process of its own beside the
tests before; the test opens libr4d on that cache, the compiled library loaded, not built again."""

import functools
import os
import platform
from pathlib import Path

import numpy as np
import pytest

import early_builds
import in_subprocess
from radiance.engine.loading.registry import Registry
from test_libr4d_support import (
    HEAD_DIM, HEADS, KV_HEADS, TOL_A16, TOL_F32, TOLERANCE, activations, launch, make_weight, rel_err, row_of,
)
from test_libr4d_attention import TOL_ATTENTION, f16_store_rounds_as_numpy, paged_step, run_attention
from test_libr4d_gemma import gemma_rows_agree


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A Registry of its own, opened under the environment the test sets."""
    opened = []

    def make(**env):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        registry = Registry(radiance_home="")
        opened.append(registry)
        return registry

    yield make
    for registry in opened:
        registry.close()


def libr4d(registry):
    return next(lib for lib in registry.hierarchy if lib.name == "libr4d")


def open_libr4d(cache: str, knobs: dict) -> str:
    """libr4d opened under `knobs`, its cache folder `cache` ($XDG_CACHE_HOME), in this process: its
    backend line (what a variant's early build runs in a process of its own: the knobs are this
    process's environment)."""
    os.environ.update({"XDG_CACHE_HOME": cache, **knobs})
    registry = Registry(radiance_home="")
    try:
        return libr4d(registry).module.backend()
    finally:
        registry.close()


def variant(name: str, knobs: dict) -> tuple:
    """libr4d's first opening under `knobs` with an empty cache, in a process of its own: (the cache
    folder, the backend line it gave)."""
    cache = early_builds.folder() / f"libr4d-{name}"
    cache.mkdir()
    return cache, in_subprocess.call("test_libr4d_builds", "open_libr4d", str(cache), knobs)


def avx512_without_dq() -> Path:
    """AVX-512 F/BW/VL/VNNI without DQ compiled (not loaded): the built library's path."""
    from plugins.kernels.libr4d import native

    cc, version = native._compiler()
    return native._build("native", AVX512_WITHOUT_DQ, cc, version, early_builds.folder() / "libr4d-avx512-no-dq")


def agrees_with_libref(registry, gemv_tolerance):
    """A decode GEMV, a prefill GEMM, attention, rope, rmsnorm, silu_mul and Gemma's four ops against libref."""
    reference = Registry(radiance_home="")
    try:
        weight = make_weight("q4_1", 192, 576, seed=1)
        for m in (1, 17):
            x = activations(m, 576, 2)
            geometry = {"M": m, "N": 192, "K": 576, "wdtype": "q4_1", "dtype": "f32", "split_k": 1}
            outs = []
            for reg, library in ((registry, "libr4d"), (reference, "libref")):
                name = None if library == "libref" else ("r4d_gemv_q4_1" if m == 1 else "r4d_gemm_q4_1")
                y = np.zeros((m, 192), np.float32)
                assert launch(row_of(reg, "gemm", library, name), [x, None, y], geometry, {1: weight}) == 0
                outs.append(y)
            assert rel_err(*outs) <= (gemv_tolerance if m == 1 else TOL_F32), (m, rel_err(*outs))
        step = paged_step([(0, 5), (20, 1)], seed=2)
        ours, ref = run_attention(registry, "libr4d", step)[0], run_attention(reference, "libref", step)[0]
        assert rel_err(ours[:6], ref[:6]) <= TOL_ATTENTION
        ours, ref = (run_attention(registry, "libr4d", step, np.float16)[0],
                     run_attention(reference, "libref", step, np.float16)[0])  # an f16 cache
        assert rel_err(ours[:6], ref[:6]) <= TOL_ATTENTION
        f16_store_rounds_as_numpy(registry)
        rng = np.random.default_rng(3)
        q0 = rng.standard_normal((3, HEADS * HEAD_DIM)).astype(np.float32)
        k0 = rng.standard_normal((3, KV_HEADS * HEAD_DIM)).astype(np.float32)
        inv = (1.0 / 10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)).astype(np.float32)
        params = {"M": 3, "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "interleaved": 1,
                  "dtype": "f32"}
        rotated = []
        for reg, library in ((registry, "libr4d"), (reference, "libref")):
            q, k = q0.copy(), k0.copy()
            assert launch(row_of(reg, "rope", library), [q, k, np.array([0, 7, 300], np.int32), inv], params) == 0
            rotated.append((q, k))
        np.testing.assert_array_equal(rotated[0][0], rotated[1][0])
        gate, up = (rng.standard_normal((2, 1536)) * 3).astype(np.float32), rng.standard_normal((2, 1536)).astype(
            np.float32)
        silu = []
        for reg, library in ((registry, "libr4d"), (reference, "libref")):
            y = np.zeros((2, 1536), np.float32)
            assert launch(row_of(reg, "silu_mul", library), [gate, up, y], {"M": 2, "n": 1536, "dtype": "f32"}) == 0
            silu.append(y)
        np.testing.assert_array_equal(*silu)
        gemma_rows_agree(registry, reference)
    finally:
        reference.close()


def test_the_native_build_is_cached_by_source_hash(fresh):
    cache, backend = early_builds.result("libr4d-native", VARIANTS["libr4d-native"])  # opened first there
    built = list((cache / "radiance" / "libr4d").glob("r4d-*.so"))
    assert len(built) == 1 and built[0].name.startswith("r4d-native"), built
    stamp = built[0].stat().st_mtime_ns
    assert "native" in backend
    again = fresh(XDG_CACHE_HOME=str(cache))
    assert list((cache / "radiance" / "libr4d").glob("r4d-*.so")) == built
    assert built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
    assert "native" in libr4d(again).module.backend()


def test_the_portable_c_build_agrees_with_libref(fresh):
    cache, _ = early_builds.result("libr4d-portable", VARIANTS["libr4d-portable"])
    registry = fresh(XDG_CACHE_HOME=str(cache), RADIANCE_R4D_ISA="portable")
    backend = libr4d(registry).module.backend()
    assert backend.startswith("portable") and "portable C" in backend, backend
    agrees_with_libref(registry, TOL_F32)  # the portable GEMV has f32 activations only


def test_without_a_compiler_every_row_runs_numpy(fresh, tmp_path, capsys):
    registry = fresh(XDG_CACHE_HOME=str(tmp_path / "cache"), CC=str(tmp_path / "no-such-cc"))
    backend = libr4d(registry).module.backend()
    assert backend.startswith("numpy fallback") and "no C compiler" in backend, backend
    assert "every row runs its numpy fallback" in capsys.readouterr().err
    agrees_with_libref(registry, TOL_F32)


def test_the_numpy_fallback_can_be_asked_for(fresh):
    registry = fresh(RADIANCE_R4D_NATIVE="0")
    assert "RADIANCE_R4D_NATIVE=0" in libr4d(registry).module.backend()


def test_the_native_build_agrees_with_libref_on_one_thread(fresh):
    registry = fresh(RADIANCE_THREADS="1")
    module = libr4d(registry).module
    assert "1 thread(s)" in module.backend()
    agrees_with_libref(registry, TOL_A16)


def test_threads_follow_the_knobs(fresh):
    assert "3 thread(s)" in libr4d(fresh(RADIANCE_THREADS="3")).module.backend()
    os.environ.pop("RADIANCE_THREADS", None)
    assert "2 thread(s)" in libr4d(fresh(RADIANCE_THREADS="", OMP_NUM_THREADS="2,1")).module.backend()


def cpu_flags() -> set:
    """/proc/cpuinfo's flags (of the first CPU listed; none where there is no such file)"""
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


HASWELL = {"avx2", "fma", "f16c"} <= cpu_flags()
X86_64 = platform.machine() in ("x86_64", "AMD64")
AVX512_WITHOUT_DQ = ["-O3", "-march=icelake-server", "-mno-avx512dq"]
VARIANTS = {"libr4d-native": functools.partial(variant, "native", {}),
            "libr4d-portable": functools.partial(variant, "portable", {"RADIANCE_R4D_ISA": "portable"}),
            # built where the test runs only: the library is loaded, and its code needs the CPU's AVX2
            **({"libr4d-haswell": functools.partial(variant, "haswell", {"RADIANCE_R4D_MARCH": "haswell"})}
               if HASWELL else {})}
EARLY_BUILDS = {**VARIANTS, **({"libr4d-avx512-no-dq": avx512_without_dq} if X86_64 else {})}


def isa_of_a_native_build(flags: set) -> set:
    """The ISA names (native.py's describe) of r4d.c built with -march=native on a CPU of `flags`:
    r4d.c's R4D_AVX2, R4D_VNNI and R4D_AVX512 conditions (amx left out: the kernel grants it or not)."""
    if not {"avx2", "fma", "f16c"} <= flags:
        return {"portable C"}
    isa = {"avx2+fma"}
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        isa.add("avx512")
    if {"avx512_vnni", "avx512vl"} <= flags or "avx_vnni" in flags:
        isa.add("vnni")
    return isa


def test_the_build_for_this_cpu_is_what_loads():
    """libr4d's first opening with the default knobs and an empty cache (the early build, in a process
    of its own) loads the native build with the paths this CPU reports: a native build that fails and
    falls back to portable C (a run several times slower, with only a warning) fails here."""
    environment = early_builds.environment()  # what the early build ran under
    knobs = [key for key in ("RADIANCE_R4D_NATIVE", "RADIANCE_R4D_ISA", "RADIANCE_R4D_MARCH") if environment.get(key)]
    if knobs:
        pytest.skip(f"{', '.join(knobs)} set: not the default build")
    _, backend = early_builds.result("libr4d-native", VARIANTS["libr4d-native"])
    assert backend.startswith("native build ("), backend
    isa = set(backend[len("native build ("):backend.index(")")].split(", "))
    flags = cpu_flags()
    assert isa - {"amx"} == isa_of_a_native_build(flags), (backend, sorted(flags))
    assert "amx" not in isa or {"amx_tile", "amx_int8"} <= flags, backend


def test_a_failed_native_build_warns_and_loads_portable_c(fresh, capsys):
    cache, _ = early_builds.result("libr4d-portable", VARIANTS["libr4d-portable"])  # the portable build cached
    registry = fresh(XDG_CACHE_HOME=str(cache), RADIANCE_R4D_MARCH="no-such-cpu")  # gcc refuses the -march
    backend = libr4d(registry).module.backend()
    assert backend.startswith("portable build"), backend
    err = capsys.readouterr().err
    assert "native build failed" in err and "no-such-cpu" in err and "running the portable build instead" in err, err


@pytest.mark.skipif(not HASWELL, reason="no AVX2/FMA/F16C")
def test_the_avx2_paths_without_vnni_agree_with_libref(fresh):
    """-march=haswell: the int8 and int16 dot products through vpmaddubsw / vpmaddwd."""
    cache, _ = early_builds.result("libr4d-haswell", VARIANTS["libr4d-haswell"])
    registry = fresh(XDG_CACHE_HOME=str(cache), RADIANCE_R4D_MARCH="haswell")
    backend = libr4d(registry).module.backend()
    assert "avx2+fma" in backend and "vnni" not in backend, backend
    agrees_with_libref(registry, TOL_A16)
    reference = Registry(radiance_home="")
    try:
        for fmt, n, k in (("q4_1", 576, 1536), ("q8_0", 4096, 576)):
            weight = make_weight(fmt, n, k, seed=4)
            for aq in (0, 8, 16):
                x = activations(2, k, 5)
                geometry = {"M": 2, "N": n, "K": k, "wdtype": fmt, "dtype": "f32", "split_k": 1, "aq": aq}
                y, ref = np.zeros((2, n), np.float32), np.zeros((2, n), np.float32)
                assert launch(row_of(registry, "gemm", "libr4d", f"r4d_gemv_{fmt}"), [x, None, y], geometry,
                              {1: weight}) == 0
                assert launch(row_of(reference, "gemm", "libref"), [x, None, ref], geometry, {1: weight}) == 0
                assert rel_err(y, ref) <= TOLERANCE[aq], (fmt, aq, rel_err(y, ref))
    finally:
        reference.close()


def test_an_avx512_build_without_dq_compiles():
    """AVX-512 F/BW/VL/VNNI without DQ (a VM may mask it): the 512-bit paths use F's extracts and
    inserts only. A compile only (an early build), which needs gcc but not such a CPU (x86-64 hosts)."""
    from plugins.kernels.libr4d import native

    if not X86_64:
        pytest.skip(f"an x86-64 build ({platform.machine()} here)")
    try:
        native._compiler()
    except native.NativeUnavailable as error:
        pytest.skip(str(error))
    assert early_builds.result("libr4d-avx512-no-dq", avx512_without_dq).exists()
