"""The decode band's GEMVs on Hopper's tensor cores (docs/LIBR4D.md "Tensor cores", "The decode band on
Hopper"): where device_tensor_cores.band_kernel_for says 'skinny' (bf16 weights, an sm_90, M = 2 .. 8),
the GEMV row and its fused rows (device_rows.py: rmsnorm_gemm3, rmsnorm_gemm2_silu_mul, gemm_add,
take_rows_rmsnorm_gemm_sample) launch r4d_split_bf16_dev (gemm_inputs.cu: x's rows, normed where the
row folds a norm, as 16 hi and lo bf16 rows into the scratch) and then gemm_skinny.cu's
r4d_skinny_band_bf16 with the row's epilogue; the lm head then r4d_sample_groups_dev, as on gemv.cu. The rows,
their constraints and their tolerance are the GEMV's: which kernels a launch issues is the card's and
the launch's M, as device_batch_rows.py's tensor-core row picks its kernel."""

from radiance.abi import KernelArgs

from . import device_kernels as dk
from . import device_tensor_cores as tc
from .device_rows import DeviceWeight, GemvExtras, ScratchTooSmall, Step, _vendor

SPLIT_THREADS = 256  # r4d_split_bf16_dev: a block a row slot of the 8


def serves(a, pairs, mode: int = 0) -> bool:
    """Whether this launch of a band row takes the skinny kernel: band_kernel_for's answer for its card,
    M and weights, the weights alike (one format, K) and, for gate and up, as many rows each."""
    weights = [DeviceWeight(weight) for weight, _ in pairs]
    fmt, k = weights[0].label, weights[0].cols
    if any(w.label != fmt or w.cols != k for w in weights) or k % 8:
        return False
    if mode == 2 and (len(weights) != 2 or weights[0].rows != weights[1].rows):
        return False
    return tc.band_kernel_for(_vendor(a), getattr(a.stream, "target", ""), fmt, int(a.params["M"])) == "skinny"


def rows_of(pairs, mode: int) -> tuple:
    return tuple(DeviceWeight(weight).rows for weight, _ in pairs)[:1 if mode == 2 else 3]


def scratch_need(m: int, rows: tuple, k: int, mode: int, base: int) -> int:
    """The band's scratch after the GEMV's `base` bytes (bf16 weights only; 0 for the others)."""
    return tc.band_scratch_layout(m, rows, k, mode, base)["total"]


def steps(a, x: int, pairs: list, mode: int = 0, extras: GemvExtras | None = None, base: int = 0) -> tuple[list, int]:
    """The launches of a band row's GEMV over `pairs` [(weight operand, output address)] (mode 0: up to
    three, concatenated; 1: one, its residual in extras; 2: gate and up; 3: one, each block's first
    maximum into extras' best and best_index) and where the band's layout ends in the scratch:
    r4d_split_bf16_dev, then the kernel."""
    extras = extras or GemvExtras()
    weights = [DeviceWeight(weight) for weight, _ in pairs]
    m, k = int(a.params["M"]), weights[0].cols
    rows = rows_of(pairs, mode)
    layout = tc.band_scratch_layout(m, rows, k, mode, base)
    if layout["total"] > int(a.scratch_bytes or 0):
        raise ScratchTooSmall(f"{a.scratch_bytes} bytes of scratch, the band's skinny GEMM needs {layout['total']}")
    scratch = int(a.scratch or 0)
    at = lambda part: scratch + layout[part] if part in layout else 0  # noqa: E731
    norm = DeviceWeight(extras.norm_weight) if extras.norm else None
    split = (KernelArgs("r4d_split_bf16_dev").pointer(x).i32(m).i32(k).i32(extras.norm)
             .pointer(norm.codes if norm else 0).i32(norm.fmt if norm else 0).f32(a.params.get("eps", 0.0) if norm else 0.0)
             .pointer(extras.normed).pointer(extras.index).pointer(extras.gathered).i32(extras.x_rows)
             .pointer(at("rows")))
    splits, per = tc.band_split(rows, k, mode)
    args = KernelArgs(tc.BAND_ENTRY).pointer(at("rows"))
    for i in range(3):
        if i < len(pairs):
            args.pointer(weights[i].codes).pointer(pairs[i][1]).i32(weights[i].rows)
        else:
            args.pointer(0).pointer(0).i32(0)
    args.pointer(extras.residual if mode == 1 else 0)
    args.pointer(extras.best if mode == 3 else 0).pointer(extras.best_index if mode == 3 else 0)
    args.pointer(at("partial")).pointer(at("counters"))
    args.i32(m).i32(k).i32(per)
    cut = tc.BAND_CUT
    grid = (tc.band_tiles(rows, mode), 1, splits)
    return [Step("r4d_split_bf16_dev", "gemm_inputs", (dk.GEMV_MAX_M, 1, 1), (SPLIT_THREADS, 1, 1), split),
            Step(tc.BAND_ENTRY, "gemm_skinny", grid, (cut.threads, 1, 1), args, cut.shared(tc.BAND_MX),
                 tc.band_options(mode))], layout["total"]
