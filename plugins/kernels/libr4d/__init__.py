"""libr4d: the in-tree host kernel library. A row for every op of docs/OPS.md but the collectives,
on f32 activations, reading q4_1, q8_0 and plain f32/f16/bf16 weights (rows.py) and the other GGUF
block types, q4_0, q5_0, q5_1, q2_k..q6_k (rows_kquants.py), as the container stores them, and
Gemma 3's scale, rmsnorm_heads, gelu_tanh_mul and sliding_attention (rows_gemma.py).

The kernels are C (r4d.c and the r4d_*.h it includes), compiled at first load with gcc -O3
-march=native -pthread, cached on disk by a hash of the sources, and called through ctypes
(native.py); they run on r4d_pool.h's thread pool, whose threads follow RADIANCE_THREADS (else
OMP_NUM_THREADS, else the CPUs this process may use). The host collectives wait on their peers'
flags with r4d.c's futex wait when it is built, and the broadcast rings' readers copy and check their
slots with r4d_ring.c's keyed BLAKE2b. Where no compiler can build it, every row
runs a numpy body instead and the plugin says so once. docs/LIBR4D.md has the rows, their bands,
tolerances against libref and measured speed.

The collectives (all_reduce, all_gather, the chained and fused forms) are collectives.py's, and the
pipeline stage boundary's send and recv pipeline.py's, listed here from their HOST_ROWS with their
colours; should that module fail to import, the compute rows load
without them. A row is chained (rad_kernel_chain) where its name carries "r4dchain"; the tensor-core rows state
their own tolerance against libref (rad_kernel_tolerance).

It declares no schema: libref declares every op of the vocabulary, and a row may implement an op
another library declares."""

import logging

from radiance.abi import (
    RAD_ABI_VERSION, RAD_E_UNSUPPORTED, RAD_OK, RAD_PLUGIN_KERNEL, SIZED_OPS, RadPluginInfo, vocabulary_opd_shape,
)

from radiance.abi import host_helpers

from . import native, rows, rows_gemma, rows_kquants

log = logging.getLogger("radiance.libr4d")

_STATE = {"rows": None, "native": None, "why": None, "colour": {}, "builds": [], "tolerance": {}}
CHAIN_MARK = "r4dchain"


def _collective_rows(native) -> list:
    """(declaration, colour) of collectives.py's rows and collectives_device.py's, or of none of a
    module that will not import. A module that takes it (`use_native_add_rmsnorm`) is handed r4d.c's
    add + rmsnorm for the tail of its fused row (rows.add_rmsnorm: bit for bit libref's add then
    rmsnorm)."""
    declared = []
    try:
        from . import collectives
        if hasattr(collectives, "use_native_add_rmsnorm"):
            collectives.use_native_add_rmsnorm(rows.add_rmsnorm(native))
        if native is not None and hasattr(collectives, "use_native_wait"):
            collectives.use_native_wait(native.lib.r4d_wait_word, native.lib.r4d_wake_word)
        declared += collectives.HOST_ROWS
    except Exception as error:  # another module's failure must not take the compute rows down
        log.warning("libr4d: collective rows unavailable (%s: %s)", type(error).__name__, error)
    try:  # the pipeline stage boundary's send and recv (pipeline.py)
        from . import pipeline
        declared += pipeline.HOST_ROWS
    except Exception as error:
        log.warning("libr4d: pipeline rows unavailable (%s: %s)", type(error).__name__, error)
    try:  # the device-domain rows (collectives_device.py): the P2P rows and their _host twins
        from . import collectives_device
        declared += collectives_device.DEVICE_ROWS
    except Exception as error:
        log.warning("libr4d: device collective rows unavailable (%s: %s)", type(error).__name__, error)
    return declared


def _device_rows():
    """device_rows.py's rows, device_gguf_rows.py's (the GGUF block types) and device_gemma_rows.py's
    (Gemma 3's ops): RAD_DOMAIN_DEVICE, kernels in device/*.cu; or nothing if one will not import:
    the host rows load either way."""
    try:
        from . import device_batch_rows, device_gemma_rows, device_gguf_rows, device_prefill_rows, device_rows
        _STATE["tolerance"] = {**device_batch_rows.stated_tolerances(), **device_prefill_rows.stated_tolerances()}
        return device_rows.build_device_rows() + device_gguf_rows.build_rows() + device_gemma_rows.build_rows()
    except Exception as error:  # the device rows must not take the host rows down
        log.warning("libr4d: device rows unavailable (%s: %s)", type(error).__name__, error)
        return []


def _open() -> None:
    if _STATE["rows"] is not None:
        return
    try:
        loaded = native.load()
    except native.NativeUnavailable as why:
        loaded = None
        _STATE["why"] = str(why)
        log.warning("libr4d: the C kernels are unavailable (%s); every row runs its numpy fallback, "
                    "several times slower", why)
    _STATE["native"] = loaded
    if loaded is not None:
        log.debug("libr4d: %s", loaded.describe())
        # the broadcast rings' slots copied and checked in one C call (r4d_ring.c; collectives/ring.py)
        host_helpers.offer("ring_take", loaded.lib.r4d_ring_take_p)
    collective = _collective_rows(loaded)
    _STATE["rows"] = (rows.build_rows(loaded) + rows_kquants.build_rows(loaded) + rows_gemma.build_rows(loaded)
                      + [info for info, _ in collective] + _device_rows())
    _STATE["colour"] = {info.name: colour for info, colour in collective}
    for info in _STATE["rows"]:  # every row of a sized op can be called cold (rad-kbench)
        if info.opd_shape is None and info.op in SIZED_OPS:
            info.opd_shape = vocabulary_opd_shape(info.op)


def rad_plugin_abi_version():
    return RAD_ABI_VERSION


def rad_plugin_info():
    return RadPluginInfo(RAD_PLUGIN_KERNEL, "libr4d", "0.1", "host rows: C kernels (AVX-512/AVX2, a thread pool) built at "
                         "first load, numpy where no compiler is found; device rows: device/*.cu through "
                         "nvrtc/hiprtc", "host cuda hip")


def rad_plugin_open():
    _open()
    return RAD_OK


def rad_kernel_schema_count():
    return 0


def rad_kernel_schema_at(i):
    raise IndexError(i)


def rad_kernel_count():
    _open()
    return len(_STATE["rows"])


def rad_kernel_at(i):
    _open()
    return _STATE["rows"][i]


def rad_kernel_collective(i):
    _open()
    return _STATE["colour"].get(_STATE["rows"][i].name, 0)


def rad_kernel_chain(i):
    _open()
    return CHAIN_MARK in _STATE["rows"][i].name


def rad_kernel_tolerance(i):
    """The tensor-core rows' own agreement with libref (device_batch_rows.stated_tolerances); -1 for
    every other row: held to its op's tolerance."""
    _open()
    return _STATE["tolerance"].get(_STATE["rows"][i].name, -1.0)


def backend() -> str:
    """What the rows run on, in words (for logs and benchmarks)."""
    _open()
    if _STATE["native"] is None:
        return f"numpy fallback ({_STATE['why']})"
    return _STATE["native"].describe()


def set_threads(n: int) -> int:
    """Threads per launch from now on (the benchmark sweeps it); returns what was set."""
    _open()
    return _STATE["native"].set_threads(n) if _STATE["native"] is not None else 1


def avx_isa_force(level: int) -> int:
    """rad-avx-check: rebind every compute row's launch to the build of ISA level `level` (native.py's
    ISA_LEVELS: 0 portable C, 1 the AVX2/FMA paths, 2 this CPU's best); RAD_E_UNSUPPORTED for a
    level this CPU does not run or that will not build. The rows keep their declarations."""
    _open()
    try:
        loaded = native.load_level(int(level))
    except native.NativeUnavailable as why:
        log.info("libr4d: ISA level %s unavailable: %s", level, why)
        return RAD_E_UNSUPPORTED
    loaded.lib.r4d_par_force(_STATE.get("par_force", 0))
    _STATE["builds"].append(loaded)  # its functions stay loaded while a plan may hold them
    fresh = {info.name: info for info in rows.build_rows(loaded) + rows_kquants.build_rows(loaded)}
    for info in _STATE["rows"]:
        if info.name in fresh:
            info.launch = fresh[info.name].launch
    log.info("libr4d: rows now on the %s build (%s)", loaded.variant, loaded.describe())
    return RAD_OK


def avx_par_force(threads: int) -> int:
    """rad-avx-check: every parallel region of every build on `threads` threads whatever its size (0:
    each region sized as usual)."""
    _open()
    _STATE["par_force"] = max(0, int(threads))
    for loaded in [_STATE["native"], *_STATE["builds"]]:
        if loaded is not None:
            loaded.lib.r4d_par_force(_STATE["par_force"])
    return RAD_OK
