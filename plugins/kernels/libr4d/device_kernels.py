"""The device rows' sources and launch geometry: host-checkable arithmetic, no card needed.

Each op's source is device/common.cu followed by the op's file (nvrtc/hiprtc take one string, no
include path); RadStream.kernel compiles it once per source and target and caches it."""

import os
from dataclasses import dataclass
from pathlib import Path

FOLDER = Path(__file__).resolve().parent / "device"
FILES = ("elementwise", "gemv", "gemv_stream", "gemm", "attention", "sample", "gemm_mma", "gemm_wgmma", "gemm_skinny",
         "gemm_inputs", "attention_tiles", "gemv_gguf", "gemma", "attention_window", "gemm_streamed",
         "gemm_tma", "attention_decode")
PARTS = {"gemv": ("gemv_parts",), "gemv_stream": ("gemv_parts",),  # what goes between common.cu and the op's file
         "attention_window": ("attention",),
         **{name: ("tensor_core",) for name in ("gemm_mma", "gemm_wgmma", "gemm_inputs", "attention_tiles", "gemm_streamed")},
         # gemm_wgmma.cu's wgmma PTX and loader (built with R4D_WG_ONLY=3: no entry of its own)
         "gemm_tma": ("tensor_core", "gemm_wgmma"), "gemm_skinny": ("tensor_core", "gemm_wgmma")}
# NVIDIA's alone (mma.sync, wgmma, cp.async, e4m3 conversion in inline PTX): never built for AMD,
# whose rows keep gemm.cu and attention.cu (device_tensor_cores.kernel_for, device_attention_tiles.serves)
NVIDIA_ONLY = ("gemm_mma", "gemm_wgmma", "gemm_inputs", "attention_tiles", "gemm_streamed", "gemm_tma", "gemm_skinny",
               "attention_decode")

GEMV_MAX_M = 8          # the decode GEMV serves M <= 8 (MT = 1, 2, 4, 8 register rows)


@dataclass(frozen=True)
class GemvShape:
    """How gemv.cu cuts the work: warps a block, output rows a warp (even: mode 2 pairs rows),
    16-byte steps a lane keeps in flight, and the fewest register rows (MT) whose products run on
    tensor cores (bf16 and e4m3 weights on NVIDIA sm_80 and later; 16: never). bench/device_ops.py
    --sweep times other cuts."""
    # 4 warps of 8 rows, one step in flight: on an H200 (bench/results/h200_card_runs_2026-12-03c.md) the
    # fastest cut at M = 1 and 8 in bench/device_ops.py and in a whole 8B decode step (4.80 against
    # 5.20 ms captured for 4, 4, 2)
    warps: int = 4
    rows: int = 8
    pipe: int = 1
    tensor_cores_from: int = 8

    @property
    def group(self) -> int:
        return self.warps * self.rows

    def defines(self) -> tuple:
        return (f"-DGEMV_WARPS={self.warps}", f"-DGEMV_ROWS={self.rows}", f"-DGEMV_PIPE={self.pipe}",
                f"-DGEMV_TC_FROM={self.tensor_cores_from}")

    @classmethod
    def parse(cls, text: str) -> "GemvShape":
        """'warps,rows,pipe[,tensor_cores_from]' (R4D_GEMV_SHAPE): ValueError naming what is wrong."""
        try:
            parts = [int(part) for part in text.split(",")]
            if len(parts) not in (3, 4):
                raise ValueError
        except ValueError:
            raise ValueError(f"R4D_GEMV_SHAPE={text!r}: expected 'warps,rows,pipe[,tensor_cores_from]', "
                             "three or four integers") from None
        shape = cls(*parts)
        if not (1 <= shape.warps <= 32 and 2 <= shape.rows <= 16 and shape.rows % 2 == 0 and 1 <= shape.pipe <= 8
                and shape.tensor_cores_from in (2, 4, 8, 16)):
            raise ValueError(f"R4D_GEMV_SHAPE={text!r}: warps 1..32, rows an even 2..16, pipe 1..8, "
                             "tensor_cores_from 2, 4, 8 or 16 (never)")
        return shape


# R4D_GEMV_SHAPE="warps,rows,pipe[,tensor_cores_from]" cuts gemv.cu's work otherwise for a process (read at load, as every
# launch geometry below binds it): how bench/card_generate.py tries other cuts in a whole decode step.
GEMV = GemvShape.parse(os.environ["R4D_GEMV_SHAPE"]) if os.environ.get("R4D_GEMV_SHAPE") else GemvShape()
GEMV_GROUP = GEMV.group  # a block's row group
GEMM_TILE = 64          # gemm.cu's 64x64 output tiles, 256 threads
ATT_THREADS = 256       # attention.cu: a block per (token, kv head, split), on every vendor
ATT_TILE = 32           # attention.cu: keys a block takes at a time (8 lanes a key); a split is whole tiles
ATT_MAX_HEAD_DIM = 256  # 64 16-byte chunks: a value lane each, four lanes of keys over a tile
ATT_HEAD_DIM_STEP = 4   # head_dim a multiple of 4: rows read as 16-byte chunks
ATT_MAX_GROUP = 8       # query heads per kv head a block takes
ATT_MAX_SPLITS = 32
ATT_MAX_FRESH = 8       # attention.cu: this step's keys of a sequence the fused row rotates in shared memory
SAMPLE_THREADS = 1024
ELEMENTWISE_THREADS = 256
FMT_MACROS = {"f32": "FMT_F32", "f16": "FMT_F16", "bf16": "FMT_BF16", "q8_0": "FMT_Q8_0", "q4_1": "FMT_Q4_1",
              "fp8_channel": "FMT_FP8_ROW", "fp8": "FMT_FP8_TENSOR"}

# max|y - ref| / max|ref| against libref, per row (docs/LIBR4D.md 'Device rows'); 0 means bit-exact
TOLERANCE = {"embedding": 0.0, "add": 0.0, "take_rows": 0.0, "rope": 1e-6, "silu_mul": 1e-6,
             "rmsnorm": 5e-6, "gemv": 2e-5, "gemm": 0.0, "attention": 2e-5, "sample": 0.0}

_SOURCES: dict = {}


def source(name: str) -> str:
    """common.cu + the parts it builds on + <name>.cu, read once."""
    if name not in FILES:
        raise KeyError(f"no device source {name!r} (known: {', '.join(FILES)})")
    text = _SOURCES.get(name)
    if text is None:
        files = ("common", *PARTS.get(name, ()), name)
        text = _SOURCES[name] = "\n".join((FOLDER / f"{file}.cu").read_text() for file in files)
    return text


def gemv_variant(m: int) -> int:
    """The register rows a GEMV launch carries for M rows: the next of 1, 2, 4, 8."""
    for mt in (1, 2, 4, 8):
        if m <= mt:
            return mt
    raise ValueError(f"the device GEMV serves M <= {GEMV_MAX_M}, not {m}")


def gemv_name(m: int) -> str:
    """gemv.cu's entry for M activation rows (one module per format, mode and norm)."""
    return f"r4d_gemv_m{gemv_variant(m)}"


@dataclass(frozen=True)
class StreamShape:
    """How gemv_stream.cu cuts the work: warps a block, blocks a multiprocessor (the grid: no more),
    rows a unit (what a warp streams together), 16-byte steps a lane keeps in flight per row, units
    a warp prefetches into the L2 ahead of its loads (0: none). The defaults are the cut
    bench/device_ops.py --sweep found fastest over one 8B layer's GEMVs on an H200."""
    warps: int = 4
    blocks: int = 4
    unit: int = 2
    depth: int = 4
    ahead: int = 0

    def defines(self) -> tuple:
        return (f"-DGS_WARPS={self.warps}", f"-DGS_BLOCKS={self.blocks}", f"-DGS_UNIT={self.unit}",
                f"-DGS_DEPTH={self.depth}", f"-DGS_AHEAD={self.ahead}")

    @classmethod
    def parse(cls, text: str) -> "StreamShape":
        """'warps,blocks,unit,depth,ahead', as --sweep prints it; '1' is the default cut."""
        return cls() if text.strip() == "1" else cls(*(int(part) for part in text.split(",")))


# gemv_stream.cu is opt-in: R4D_GEMV_STREAM=1 (or a cut, "warps,blocks,unit,depth,ahead") turns it
# on for a process. Faster alone (bench/device_ops.py), it made the fused 8B decode slower on an H200
# (docs/LIBR4D.md, "The two decode GEMVs"), so gemv.cu stays the default until that is understood.
STREAM = StreamShape.parse(os.environ["R4D_GEMV_STREAM"]) if os.environ.get("R4D_GEMV_STREAM") else None
STREAM_MAX_MT = 4               # the stream entries carry MT = 1, 2, 4
STREAM_MAX_BLOCKS = 1024        # the grid never exceeds this (argmax_groups sizes for it)


def streams(vendor: str, target: str, m: int, segments: list, multiprocessors: int, shape: StreamShape) -> bool:
    """Whether gemv_stream.cu serves this GEMV: an NVIDIA card from sm_80 on, M <= 4, every matrix of
    whole units, and a unit for every other warp of the grid at least (narrower shapes keep too few
    bytes in flight; gemv.cu splits their K instead)."""
    if vendor != "cuda" or not target.startswith("sm_") or int(target[3:].rstrip("a")) < 80:
        return False
    if gemv_variant(m) > STREAM_MAX_MT or any(rows % shape.unit for rows in segments):
        return False
    return 2 * (sum(segments) // shape.unit) >= max(1, multiprocessors) * shape.blocks * shape.warps


def stream_grid(n: int, multiprocessors: int, shape: StreamShape) -> tuple:
    """shape.blocks blocks a multiprocessor, never more blocks than units."""
    blocks = max(1, min(multiprocessors * shape.blocks, n // shape.unit, STREAM_MAX_BLOCKS))
    return (blocks, 1, 1), (shape.warps * 32, 1, 1)


def stream_name(m: int) -> str:
    return f"r4d_gemv_stream_m{gemv_variant(m)}"


def warp_size(vendor: str) -> int:
    """Lanes of a warp as the sources see it (R4D_WARP): 64 on AMD's wavefronts, 32 on NVIDIA."""
    return 64 if vendor == "hip" else 32


def gemv_grid(n: int, warp: int = 32, splits: int = 1, shape: GemvShape = GEMV) -> tuple:
    return (-(-n // shape.group), splits, 1), (shape.warps * warp, 1, 1)


def gemv_options(fmt: str, mode: int = 0, norm: int = 0, shape: GemvShape = GEMV) -> tuple:
    """The compile options of gemv.cu for a weight format, an epilogue mode and a folded norm."""
    return (f"-DR4D_GEMV_FMT={FMT_MACROS[fmt]}", f"-DR4D_GEMV_MODE={mode}", f"-DR4D_GEMV_NORM={norm}",
            *shape.defines())


GEMV_CHUNK_ELEMENTS = {"f32": 4, "f16": 8, "bf16": 8, "q8_0": 16, "q4_1": 32,  # one lane's 16 bytes
                       "fp8_channel": 16, "fp8": 16}
GEMV_TARGET_BLOCKS = 512  # about the blocks an H200 (132 multiprocessors) holds at once: K is split up to it, not past it
GEMV_MAX_SPLITS = 16


def gemv_split(n: int, k: int, fmt: str, warp: int = 32, shape: GemvShape = GEMV) -> tuple[int, int]:
    """(splits, k_chunk): K cut into `splits` chunks of `k_chunk` elements, each a whole number of a
    warp's steps and at least `shape.pipe` of them, when N alone gives fewer than
    GEMV_TARGET_BLOCKS blocks: as many splits as keep the grid within GEMV_TARGET_BLOCKS (one wave;
    a partial second wave cost the fused q, k, v 1.7 µs of 22 on an H200). One split: k_chunk = K."""
    step = warp * GEMV_CHUNK_ELEMENTS[fmt]
    steps = -(-k // step)
    blocks = -(-n // shape.group)
    splits = max(1, min(GEMV_TARGET_BLOCKS // blocks, GEMV_MAX_SPLITS, steps // max(2, shape.pipe)))
    if splits == 1:
        return 1, k
    chunk = -(-steps // splits) * step
    return -(-k // chunk), chunk


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def gemv_scratch_layout(m: int, n: int, k: int, fmt: str, warp: int = 32, shape: GemvShape = GEMV) -> tuple[int, int]:
    """(offset of the partial sums, total bytes): a u32 counter per row group, then [splits, M, N] f32."""
    splits, _ = gemv_split(n, k, fmt, warp, shape)
    if splits == 1:
        return 0, 0
    counters = _aligned(4 * -(-n // shape.group))
    return counters, counters + 4 * splits * m * n


def argmax_groups(n: int) -> int:
    """The most (value, index) maxima a fused lm head GEMV of N rows leaves: one a row group of
    gemv.cu, or one a block of gemv_stream.cu."""
    return max(-(-n // GEMV_GROUP), min(n // 2, STREAM_MAX_BLOCKS))


def argmax_layout(m: int, n: int) -> tuple[int, int, int]:
    """A fused lm head's scratch after its GEMV's: (offset of each row group's best value [groups, M],
    of its index, bytes of both), relative to their own start."""
    groups = argmax_groups(n)
    values = _aligned(4 * groups * m)
    return 0, values, values + _aligned(4 * groups * m)


def setting(name: str, text: str, low: int, high: int) -> int:
    """An integer low..high from the environment variable `name` (its text): ValueError naming it."""
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ValueError(f"{name}={text!r}: expected an integer {low}..{high}")
    return value


# R4D_ATT_SPLITS=n gives every attention launch of a process n splits per (token, kv head) in its
# grid in place of attention_splits' choice (read at load, as GEMV above; bench/card_attention.py
# --splits sets ATT_SPLITS itself between its cases): how a card sweeps the cut of a short context.
ATT_SPLITS = setting("R4D_ATT_SPLITS", os.environ["R4D_ATT_SPLITS"], 1, ATT_MAX_SPLITS) \
    if os.environ.get("R4D_ATT_SPLITS") else None
# tiles past the one in registers that an attention block asks into the L2 (attention.cu's
# R4D_ATT_AHEAD; 0: none). R4D_ATT_AHEAD=n sets it for a process; bench/card_attention.py --ahead
# sets ATT_AHEAD itself between its cases (a module per value). 0 by default: on an H200
# (bench/results/h200_card_runs_2026-12-03e.md) 2 ahead was level at batch 1 and 1.5x slower at batch 8
# from 4096 positions (151 against 97 us at 4096, 288 against 190 at 8192).
ATT_AHEAD = setting("R4D_ATT_AHEAD", os.environ["R4D_ATT_AHEAD"], 0, 8) if os.environ.get("R4D_ATT_AHEAD") else 0


def attention_splits(m: int, kv_heads: int, multiprocessors: int) -> int:
    """Splits of the context per (token, kv head): about two blocks per multiprocessor in all, or
    ATT_SPLITS where set; never more than ATT_MAX_SPLITS (the scratch sizes for M * kv_heads + 512
    partials, attention_scratch_layout; the grid never has more than that)."""
    if ATT_SPLITS is not None:
        return min(ATT_SPLITS, (m * kv_heads + 512) // (m * kv_heads))
    want = -(-2 * min(max(multiprocessors, 1), 256) // (m * kv_heads))
    return max(1, min(ATT_MAX_SPLITS, want))


def token_splits(keys: int, grid_splits: int) -> tuple[int, int]:
    """(splits, keys a split) of a token that sees `keys` keys, as attention.cu works them out:
    at most the grid's splits, each a whole number of ATT_TILE keys and at least one tile."""
    splits = min(grid_splits, max(1, -(-keys // ATT_TILE)))
    chunk = max(1, -(-(-(-keys // splits)) // ATT_TILE)) * ATT_TILE
    return max(1, -(-keys // chunk)), chunk


def attention_partial_floats(group: int, head_dim: int) -> int:
    """Floats of one (token, kv head, split)'s partial: `group` rows of head_dim weighted values,
    then each head's (max, sum), rounded up to whole 16-byte chunks (attention.cu's STRIDE)."""
    return -(-group * (head_dim + 2) // 4) * 4


def attention_scratch_layout(m: int, kv_heads: int, group: int, head_dim: int) -> tuple[int, int]:
    """(offset of the split partials, bytes): a partial per (token, kv head, split) from the scratch's
    start. Its M * kv_heads + 1 u32 counters (one per (token, kv head) and one for the grid) are the
    scratch's tail's (device_attention_decode.counters_offset), where no step's partials reach them."""
    return 0, 4 * (m * kv_heads + 512) * attention_partial_floats(group, head_dim)


def attention_options(head_dim: int, group: int) -> tuple:
    return (f"-DR4D_ATT_D={head_dim}", f"-DR4D_ATT_G={group}", f"-DR4D_ATT_AHEAD={ATT_AHEAD}")


def gemm_grid(m: int, n: int) -> tuple:
    return (-(-n // GEMM_TILE), -(-m // GEMM_TILE), 1), (256, 1, 1)


def rows_grid(m: int, n: int) -> tuple:
    """One thread per column of M rows: (ceil(n / 256), M)."""
    return (-(-n // ELEMENTWISE_THREADS), m, 1), (ELEMENTWISE_THREADS, 1, 1)


def flat_grid(count: int, multiprocessors: int) -> tuple:
    """A grid-stride launch over `count` values: at most 8 blocks per multiprocessor."""
    blocks = max(1, min(-(-count // ELEMENTWISE_THREADS), 8 * max(1, multiprocessors)))
    return (blocks, 1, 1), (ELEMENTWISE_THREADS, 1, 1)


def norm_grid(m: int, warp: int = 32) -> tuple:
    """rmsnorm: a warp per row, four rows a block."""
    return (-(-m // 4), 1, 1), (4 * warp, 1, 1)


def padded(vocab: int) -> int:
    """The power of two the sample row's key sort runs over."""
    span = 1
    while span < vocab:
        span <<= 1
    return span


def sample_scratch_bytes(m: int, vocab: int) -> int:
    """Per row: `padded(vocab)` u64 keys and `vocab` f32 running sums."""
    return max(1, int(m)) * (padded(int(vocab)) * 8 + int(vocab) * 4)
