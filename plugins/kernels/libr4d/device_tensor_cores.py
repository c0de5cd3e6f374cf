"""The tensor-core GEMM's geometry, host-checkable (no card): which kernel a card runs, tiles, the
split of K, the scratch layout, and the tolerance against libref (device_batch_rows.py builds the
launches; docs/LIBR4D.md "Tensor cores").

Kernels, chosen by the card (`kernel_for`): gemm_wgmma.cu's warpgroup MMA on Hopper (sm_90, built
for sm_90a: the way to its fp8 tensor cores and full bf16 rate; its bf16 kind reads x as bf16 rows
that r4d_narrow_bf16_dev writes into the scratch first), gemm_mma.cu's mma.sync from sm_80
(its e4m3 kind from sm_89), and elsewhere (AMD, older NVIDIA) gemm.cu's f32 SIMT tiles, which every
format reads. R4D_TC_KERNEL=wgmma|mma|simt forces one for a process (the card tests compare
them)."""

import os

GEMV_MAX_M = 8          # device_kernels.GEMV_MAX_M: the rows here take M above it
TILE_N = 128            # gemm_mma.cu's TC_BN
THREADS = 256
STAGES = 3              # gemm_mma.cu's TC_STAGES
ROW_BYTES = 80          # a shared-memory row: 64 bytes of K and 16 of padding
TARGET_BLOCKS = 264     # split K until about two blocks a multiprocessor of an H200 (132)
MAX_SPLITS = 8
MIN_TILES_PER_SPLIT = 4
KINDS = ("bf16", "e4m3")
KERNELS = ("wgmma", "mma", "simt")
KERNEL = os.environ.get("R4D_TC_KERNEL") or None

# max|y - ref| / max|ref| against libref's f32 gemm (docs/OPS.md "Agreement"): x rounded to bf16
# (half an ulp is 2^-9 of a value) or quantised per row to e4m3 (2^-4), f32 accumulation. Measured
# with the kernels' numpy forms (tests/fixtures/r4d_fake_kernels.py) on SmolLM2's and Llama-3-8B's
# shapes, M = 9, 64, 200, activations with 8x outlier channels: worst bf16 2.0e-3, e4m3 3.0e-2 (an
# outlier channel sets its row's scale, so the other channels get fewer of e4m3's levels). A card
# is held to the same; the order of its f32 sums moves the error by ~1e-6.
TOLERANCE = {"bf16": 4e-3, "e4m3": 6e-2}


def sm_of(target: str) -> int:
    """80 of 'sm_80', 90 of 'sm_90a'; 0 for anything else."""
    if not target.startswith("sm_"):
        return 0
    digits = target[3:].rstrip("af")
    return int(digits) if digits.isdigit() else 0


def kernel_for(vendor: str, target: str, kind: str) -> str:
    """'wgmma', 'mma' or 'simt' for a GEMM of `kind` on this card."""
    if kind not in KINDS:
        raise ValueError(f"no tensor-core kind {kind!r} (known: {', '.join(KINDS)})")
    if KERNEL is not None:
        if KERNEL not in KERNELS:
            raise ValueError(f"R4D_TC_KERNEL={KERNEL!r}: one of {', '.join(KERNELS)}")
        return KERNEL
    sm = sm_of(target) if vendor == "cuda" else 0
    if sm == 90:
        return "wgmma"
    if sm >= (89 if kind == "e4m3" else 80):
        return "mma"
    return "simt"


WGMMA_STAGES = 2        # gemm_wgmma.cu's WG_STAGES (options() names it), each x's and w's tiles of 128 rows x
                        # 128 bytes: 2 fill RAD_MAX_SHARED_BYTES; more only where that rule allows more
WGMMA_STAGE_BYTES = 2 * 128 * 128  # 32 KiB: two stages are the 64 KiB a launch may have (RAD_MAX_SHARED_BYTES)
# gemm_wgmma.cu's WG_GROUP: row tiles a group of blocks goes down before moving right (16: a wave of
# 264 blocks is 16 x ~16 tiles); R4D_WG_GROUP=1 restores the old order (a wave along one row tile),
# for a card to compare
WGMMA_GROUP = int(os.environ.get("R4D_WG_GROUP") or 16)
NARROW_THREADS = 256    # r4d_narrow_bf16_dev: 8 values a thread a step
NARROW_MAX_BLOCKS = 4096
TC_KERNELS = ("mma", "wgmma")


def tile_m(m: int, kernel: str = "mma") -> int:
    """Rows of a block's tile: mma.sync 64 for batched decode's few rows, 128 for prefill; wgmma's
    two warpgroups of 64 always 128."""
    return 128 if kernel == "wgmma" or m > 64 else 64


def k_tile(kind: str, kernel: str = "mma") -> int:
    """K elements of one shared-memory step: 64 bytes for mma.sync (32 bf16, 64 e4m3), 128 for
    wgmma's 128-byte swizzled rows (64 bf16, 128 e4m3)."""
    step = 128 if kernel == "wgmma" else 64
    return step // 2 if kind == "bf16" else step


def split(m: int, n: int, k: int, kind: str, kernel: str = "mma") -> tuple[int, int]:
    """(splits, k-tiles a split): K cut where the output tiles alone give fewer than TARGET_BLOCKS
    blocks, into at most ceil(TARGET_BLOCKS / tiles) splits (and MAX_SPLITS), each at least
    MIN_TILES_PER_SPLIT tiles, none empty: of those counts the one that takes the fewest k-tile
    steps end to end, ceil(tiles * splits / TARGET_BLOCKS) waves of ceil(steps / splits) steps (the
    fewest splits of equals). So 128 tiles take 2 splits (256 blocks, one wave of 32 steps), not 3
    (384 blocks, two waves of 22: 44). From shapes and the kernel only, so every card of a kind adds
    the same partial sums in the same order."""
    tiles = -(-m // tile_m(m, kernel)) * -(-n // TILE_N)
    steps = -(-k // k_tile(kind, kernel))
    best, best_steps = 1, None
    for splits in range(1, max(1, min(-(-TARGET_BLOCKS // tiles), MAX_SPLITS, steps // MIN_TILES_PER_SPLIT)) + 1):
        per = -(-steps // splits)
        count = -(-steps // per)  # the splits that are not empty
        along = -(-tiles * count // TARGET_BLOCKS) * per
        if best_steps is None or along < best_steps:
            best, best_steps = count, along
    per = -(-steps // best)
    return -(-steps // per), per


ENTRIES = ("r4d_mma_gemm_bf16_m64", "r4d_mma_gemm_bf16_m128", "r4d_mma_gemm_e4m3_m64", "r4d_mma_gemm_e4m3_m128")
WGMMA_ENTRIES = ("r4d_wgmma_gemm_bf16", "r4d_wgmma_gemm_e4m3")


def entry(kind: str, m: int, kernel: str = "mma") -> str:
    return f"r4d_wgmma_gemm_{kind}" if kernel == "wgmma" else f"r4d_mma_gemm_{kind}_m{tile_m(m)}"


def source(kernel: str) -> str:
    return "gemm_wgmma" if kernel == "wgmma" else "gemm_mma"


def options(name: str) -> tuple:
    """Compile only the entry a launch needs: each takes nvrtc seconds (R4D_TC_ONLY, R4D_WG_ONLY);
    wgmma needs sm_90a, which replaces the card's sm_90 (radiance.device.cuda.nvrtc_compile)."""
    if name in WGMMA_ENTRIES:
        return ("--gpu-architecture=sm_90a", f"-DR4D_WG_ONLY={WGMMA_ENTRIES.index(name) + 1}", f"-DWG_STAGES={WGMMA_STAGES}",
                f"-DWG_GROUP={WGMMA_GROUP}")
    return (f"-DR4D_TC_ONLY={ENTRIES.index(name) + 1}",)


def grid(m: int, n: int, splits: int, kernel: str = "mma") -> tuple:
    """mma.sync: (column tiles, row tiles, splits); wgmma: (tiles, 1, splits), the kernel ordering its
    tiles in groups of WGMMA_GROUP row tiles (gemm_wgmma.cu's WG_GROUP). Either way a split-K counter a tile."""
    if kernel == "wgmma":
        return (-(-n // TILE_N) * -(-m // tile_m(m, kernel)), 1, splits), (THREADS, 1, 1)
    return (-(-n // TILE_N), -(-m // tile_m(m, kernel)), splits), (THREADS, 1, 1)


def shared_bytes(m: int, kernel: str = "mma") -> int:
    """Dynamic shared memory: gemm_mma.cu's TC_STAGES stages of an A and a B tile, or
    gemm_wgmma.cu's WG_STAGES stages of swizzled x and w tiles (no slack: the kernel has no static
    shared memory, so its dynamic area starts 1024-aligned)."""
    if kernel == "wgmma":
        return WGMMA_STAGES * WGMMA_STAGE_BYTES
    return STAGES * (tile_m(m) + TILE_N) * ROW_BYTES


def narrow_grid(m: int, k: int) -> tuple:
    """r4d_narrow_bf16_dev's grid and block over M * K values (a grid-stride loop past the cap)."""
    return (max(1, min(NARROW_MAX_BLOCKS, -(-m * k // (8 * NARROW_THREADS)))), 1, 1), (NARROW_THREADS, 1, 1)


def narrows(kind: str, kernel: str) -> bool:
    """Whether x goes through the scratch as bf16 rows first: gemm_wgmma.cu's bf16 kind reads both
    operands as bytes (gemm_mma.cu narrows its f32 x itself)."""
    return kind == "bf16" and kernel == "wgmma"


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def scratch_layout(m: int, n: int, k: int, kind: str, kernel: str = "mma") -> dict:
    """Offsets in the row's scratch: split-K counters (a u32 a tile) and partial sums [splits, M, N]
    f32 where K is split; for e4m3, x's codes [M, K] and row scales [M]; for wgmma's bf16, x's bf16
    rows [M, K] ("codes"); and the total."""
    splits, _ = split(m, n, k, kind, kernel)
    at, layout = 0, {}
    if splits > 1:
        (tx, ty, _), _ = grid(m, n, splits, kernel)
        layout["counters"], at = at, _aligned(4 * tx * ty)
        layout["partial"], at = at, _aligned(at + 4 * splits * m * n)
    if kind == "e4m3":
        layout["codes"], at = at, _aligned(at + m * k)
        layout["scales"], at = at, _aligned(at + 4 * m)
    elif narrows(kind, kernel):
        layout["codes"], at = at, _aligned(at + 2 * m * k)
    layout["total"] = at
    return layout


def scratch_bytes(max_m: int, n: int, k: int, kind: str) -> int:
    """The most any M of the band [GEMV_MAX_M + 1, max_m] needs with either tensor-core kernel (the
    split, so the partials, vary with M and the kernel; the hook does not know the card)."""
    return max((scratch_layout(m, n, k, kind, kernel)["total"] for kernel in TC_KERNELS
                for m in range(GEMV_MAX_M + 1, max(max_m, GEMV_MAX_M + 1) + 1)), default=0)
