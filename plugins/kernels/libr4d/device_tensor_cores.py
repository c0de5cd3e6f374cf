"""The tensor-core GEMM's geometry, host-checkable (no card): which kernel a card runs, tiles, the
split of K, the scratch layout, and the tolerance against libref (device_batch_rows.py builds the
launches; docs/LIBR4D.md "Tensor cores").

Kernels, chosen by the card (`kernel_for`): gemm_wgmma.cu's warpgroup MMA on Hopper (sm_90, built
for sm_90a: the way to its fp8 tensor cores and full bf16 rate; its bf16 kind reads x as bf16 rows
that r4d_narrow_bf16_dev writes into the scratch first), gemm_mma.cu's mma.sync from sm_80
(its e4m3 kind from sm_89), and elsewhere (AMD, older NVIDIA) gemm.cu's f32 SIMT tiles, which every
format reads. gemm_tma.cu (the same MMAs fed by TMA from a producer warp, r4d_tma_maps building its
tensor maps in the scratch first) takes Hopper's bf16 GEMMs from TMA_FROM rows (faster there on an
H200). gemm_skinny.cu (the operands swapped: w's rows wgmma's M, x's few rows its N) takes Hopper's
bf16 GEMMs of M above the GEMV band and below SKINNY_BELOW, where the weights' bytes set the time.
R4D_TC_KERNEL=wgmma|tma|skinny|mma|simt forces one for a process (the card tests compare them;
skinny is bf16's alone: e4m3 keeps the card's kernel)."""

import os
from dataclasses import dataclass, replace

GEMV_MAX_M = 8          # device_kernels.GEMV_MAX_M: the rows here take M above it
TILE_N = 128            # gemm_mma.cu's TC_BN
THREADS = 256
STAGES = 3              # gemm_mma.cu's TC_STAGES
ROW_BYTES = 80          # a shared-memory row: 64 bytes of K and 16 of padding
MULTIPROCESSORS = 132   # an H200's: the waves the split of K plans for
TARGET_BLOCKS = 264     # split K until about two blocks a multiprocessor of an H200 (mma.sync's; wgmma's: its cut's blocks)
MAX_SPLITS = 8
MIN_TILES_PER_SPLIT = 4
KINDS = ("bf16", "e4m3")
KERNELS = ("wgmma", "tma", "skinny", "mma", "simt")
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


# The fewest rows of x for which an sm_90 takes gemm_tma.cu over gemm_wgmma.cu, bf16 only. On an H200
# (bench/results/h200_card_runs_2026-12-03g.md) a layer's 8B GEMMs at M = 2048 ran 2069 us against wgmma's
# 2516 (1.22x; the whole 2048-token prefill 98.6 -> 85.7 ms), but at M = 64 497 against 443: its 64-byte
# stages lose where K is split 8 ways. 256 lies between the two measured points, where splits are few;
# e4m3 stays on wgmma until the TMA kernel's fp8 path is timed.
TMA_FROM = 256
# The most rows of x gemm_skinny.cu takes by default on an sm_90 (bf16), plus one: M = GEMV_MAX_M + 1
# .. SKINNY_BELOW - 1 (above the streamed GEMM's band where that serves: device_streamed_gemm.serves).
# At M <= 128 a GEMM reads each weight for at most 256 flops, under an H200's ~165 flops a byte of
# HBM, so the weights' bytes set the time; the swapped operands use every row of wgmma's M however
# few the rows of x. 129 until the card's figures (bench/card_prefill_gemm.py --kernels skinny wgmma
# tma --tokens 16 32 64 128) say where the tile kernels overtake it.
SKINNY_BELOW = 129


def kernel_for(vendor: str, target: str, kind: str, m: int = 0) -> str:
    """'skinny', 'tma', 'wgmma', 'mma' or 'simt' for a GEMM of `kind` with `m` rows of x on this card
    (0: a GEMM of any M: the tile kernel of the small ones). A forced 'skinny' gives e4m3 the card's
    own kernel (gemm_skinny.cu is bf16's)."""
    if kind not in KINDS:
        raise ValueError(f"no tensor-core kind {kind!r} (known: {', '.join(KINDS)})")
    if KERNEL is not None:
        if KERNEL not in KERNELS:
            raise ValueError(f"R4D_TC_KERNEL={KERNEL!r}: one of {', '.join(KERNELS)}")
        if KERNEL != "skinny" or kind == "bf16":
            return KERNEL
    sm = sm_of(target) if vendor == "cuda" else 0
    if sm == 90:
        if kind == "bf16" and GEMV_MAX_M < m < SKINNY_BELOW:
            return "skinny"
        return "tma" if kind == "bf16" and m >= TMA_FROM else "wgmma"
    if sm >= (89 if kind == "e4m3" else 80):
        return "mma"
    return "simt"


@dataclass(frozen=True)
class WgmmaCut:
    """gemm_wgmma.cu's cut of the work (its WG_* macros): a block of `rows` x `cols` outputs (rows / 64
    warpgroups of 128 threads, m64n`cols` MMAs, cols / 2 f32 accumulators a thread), `k_bytes` of K a
    stage of each row (128, 64 or 32: stored in the swizzle of that width, k_bytes / 32 MMAs a stage),
    `stages` stages of x's rows then w's, `depth` k-tiles of MMAs left in flight after a step (1 or
    2: the rest of the stages, stages - depth, are copied ahead). All stages within
    RAD_MAX_SHARED_BYTES (64 KiB a launch). Blocks a multiprocessor: two where two blocks'
    accumulators fit the registers (128 x 128), else one."""
    rows: int = 128
    cols: int = 256
    k_bytes: int = 32
    stages: int = 5
    depth: int = 1

    @property
    def threads(self) -> int:
        return 2 * self.rows

    @property
    def stage_bytes(self) -> int:
        return (self.rows + self.cols) * self.k_bytes

    @property
    def shared(self) -> int:
        return self.stages * self.stage_bytes

    @property
    def blocks(self) -> int:
        return 2 if self.threads * self.cols // 2 <= 256 * 64 else 1

    def for_kind(self, kind: str) -> "WgmmaCut":
        """The cut a kind's entry is built with: e4m3 at most two warpgroups (three of 128 accumulators
        leave 168 registers a thread, and its scales' epilogue spills there; bf16 fits)."""
        return replace(self, rows=min(self.rows, 128)) if kind == "e4m3" else self

    def defines(self) -> tuple:
        return (f"-DWG_WARPGROUPS={self.rows // 64}", f"-DWG_BN={self.cols}", f"-DWG_KB={self.k_bytes}",
                f"-DWG_STAGES={self.stages}", f"-DWG_DEPTH={self.depth}")

    def __str__(self) -> str:
        return f"{self.rows},{self.cols},{self.k_bytes},{self.stages}" + (f",{self.depth}" if self.depth != 1 else "")

    @classmethod
    def parse(cls, text: str) -> "WgmmaCut":
        """'rows,cols,k_bytes,stages[,depth]' (R4D_WG_CUT): ValueError naming what is wrong."""
        try:
            parts = [int(part) for part in text.split(",")]
            if len(parts) not in (4, 5):
                raise ValueError
        except ValueError:
            raise ValueError(f"R4D_WG_CUT={text!r}: expected 'rows,cols,k_bytes,stages[,depth]', four or five "
                             "integers") from None
        cut = cls(*parts)
        if not (cut.rows in (128, 192) and cut.cols in (128, 256) and cut.k_bytes in (32, 64, 128) and cut.depth in (1, 2)
                and cut.stages >= cut.depth + 1 and cut.shared <= 65536 and (cut.rows, cut.cols) != (192, 128)):
            raise ValueError(f"R4D_WG_CUT={text!r}: rows 128 or 192 (192 with 256 cols), cols 128 or 256, k_bytes "
                             f"32, 64 or 128, depth 1 or 2, stages >= depth + 1, stages x (rows + cols) x k_bytes <= 65536")
        return cut


# The cuts bench/card_prefill_gemm.py --cuts all compares, the first the default: 128 x 128 with 2
# stages of 128 bytes of K, two blocks a multiprocessor (the kernel of 2026-12-03d), the fastest on
# an H200 (bench/results/h200_card_runs_2026-12-03e.md: a layer's 8B GEMMs at M = 2048 0.45x cuBLAS;
# 128 x 128 in 4 stages of 64 0.44x, 192 x 256 in 4 of 32 0.39x, every 128 x 256 cut 0.31x). So
# neither more bytes in flight nor fewer L2 bytes a flop alone closes the gap; the others stay for
# the next kernel (TMA, clusters) to be measured against.
CUTS = tuple(WgmmaCut.parse(text) for text in ("128,128,128,2", "128,128,64,4", "128,256,32,5,2", "128,256,32,5",
                                                  "128,256,64,2", "192,256,32,4"))
# R4D_WG_CUT="rows,cols,k_bytes,stages[,depth]" cuts gemm_wgmma.cu's work otherwise for a process; read at
# every launch's plan (the bench sets WGMMA_CUT between shapes to compare cuts in one run)
WGMMA_CUT = WgmmaCut.parse(os.environ["R4D_WG_CUT"]) if os.environ.get("R4D_WG_CUT") else CUTS[0]
# gemm_wgmma.cu's WG_GROUP: row tiles a group of blocks goes down before moving right (16: a wave of
# 132 or 264 blocks is 16 row tiles of ~8 or ~16 column tiles); R4D_WG_GROUP=1 restores the old order (a wave along one row tile),
# for a card to compare
WGMMA_GROUP = int(os.environ.get("R4D_WG_GROUP") or 16)
# R4D_WG_PAIRS=0: the wgmma and TMA GEMMs store their outputs one float at a time, not in pairs
# (gemm_wgmma.cu's WG_PAIRS; the bench's comparison in one call)
WG_PAIRS = os.environ.get("R4D_WG_PAIRS", "1") != "0"
# gemm_tma.cu's consumers release a stage as soon as its MMAs retire (TM_EARLY; "early", the default), or
# after the next stage's bytes have landed and its MMAs are issued (R4D_TMA_RELEASE=late, the kernel of
# 2026-12-04b). On an H200 a layer's four 8B GEMMs at M = 2048 took 1660 us early against 1909 late in one
# call (0.68x against 0.59x cuBLAS; bench/results/h200_card_runs_2026-12-04c.md): late, a stage that was
# done stayed held while its consumer waited for the next one's bytes, so the ring refilled it a load late.
TMA_RELEASE = os.environ.get("R4D_TMA_RELEASE", "early")
if TMA_RELEASE not in ("early", "late"):
    raise ValueError(f"R4D_TMA_RELEASE={TMA_RELEASE!r}: early or late")
NARROW_THREADS = 256    # r4d_narrow_bf16_dev: 8 values a thread a step
NARROW_MAX_BLOCKS = 4096
TC_KERNELS = ("mma", "wgmma", "tma", "skinny")


@dataclass(frozen=True)
class TmaCut:
    """gemm_tma.cu's cut (the WG_* macros it shares with gemm_wgmma.cu's PTX): a block of `rows` (64 or
    128: one or two consumer warpgroups of 64 rows and a producer warp, 160 or 288 threads; 192: three,
    384 threads, thread 0 issuing the loads) x `cols` columns (128: four blocks a multiprocessor at 64
    rows, two at 128, 64 f32 accumulators a thread; 112: two at 128 rows, 56, unclustered, so that two
    stages of 128 bytes of K fit; 256: one, 128; 64 rows only with 128 columns, 192 only with 256),
    `k_bytes` of K a stage of each row (128, 64 or 32: the tensor maps' swizzle and
    wgmma's layout of that width), a ring of `stages` stages. The stages, 16 bytes of mbarriers a
    stage and 16 more within RAD_MAX_SHARED_BYTES (64 KiB a launch). In clusters of `cluster_m` x
    `cluster_n` blocks (1 or 2 each; the cuts with a producer warp): the blocks down M of a cluster
    share w's tile, those across N x's, each loading its share of both and TMA multicasting it to the
    others (gemm_tma.cu's TM_CLUSTER_M, TM_CLUSTER_N)."""
    cols: int = 128
    k_bytes: int = 64
    stages: int = 3
    rows: int = 128
    cluster_m: int = 1
    cluster_n: int = 1

    @property
    def producer(self) -> bool:
        """A producer warp issues the loads (64 and 128 rows): the cuts that release early and cluster."""
        return self.rows <= 128

    @property
    def threads(self) -> int:
        return 128 * self.rows // 64 + (32 if self.producer else 0)

    @property
    def stage_bytes(self) -> int:
        return (self.rows + self.cols) * self.k_bytes

    @property
    def shared(self) -> int:
        return self.stages * self.stage_bytes + 16 * self.stages + 16

    @property
    def blocks(self) -> int:
        return {(64, 128): 4, (128, 112): 2, (128, 128): 2}.get((self.rows, self.cols), 1)

    @property
    def cluster(self) -> int:
        return self.cluster_m * self.cluster_n

    @property
    def x_box(self) -> int:
        """x's rows a block loads a stage (its share of the tile's rows)."""
        return self.rows // self.cluster_n

    @property
    def w_box(self) -> int:
        """w's rows a block loads a stage (its share of the tile's columns)."""
        return self.cols // self.cluster_m

    def blocks_for(self, m: int, n: int, cols: int = 0) -> int:
        """A launch's blocks over M x N outputs in tiles of `cols` (the cut's): the clusters' tiles of
        cluster_m x cluster_n tiles, in clusters (gemm_tma.cu's tm_blocks)."""
        rows_c, cols_c = self.rows * self.cluster_m, (cols or self.cols) * self.cluster_n
        return -(-m // rows_c) * -(-n // cols_c) * self.cluster

    def defines(self) -> tuple:
        # WG_DEPTH=1: gemm_wgmma.cu's own check of its macros holds for two stages (gemm_tma.cu keeps one
        # group of MMAs in flight whatever it says)
        return (f"-DWG_WARPGROUPS={self.rows // 64}", f"-DWG_BN={self.cols}", f"-DWG_KB={self.k_bytes}",
                f"-DWG_STAGES={self.stages}", "-DWG_DEPTH=1", f"-DTM_CLUSTER_M={self.cluster_m}",
                f"-DTM_CLUSTER_N={self.cluster_n}")

    def __str__(self) -> str:
        text = f"{self.cols},{self.k_bytes},{self.stages}"
        if self.cluster > 1:
            return text + f",{self.rows},{self.cluster_m},{self.cluster_n}"
        return text + (f",{self.rows}" if self.rows != 128 else "")

    @classmethod
    def parse(cls, text: str) -> "TmaCut":
        """'cols,k_bytes,stages[,rows[,cluster_m,cluster_n]]' (R4D_TMA_CUT): ValueError naming what is wrong."""
        try:
            parts = [int(part) for part in text.split(",")]
            if len(parts) not in (3, 4, 6):
                raise ValueError
        except ValueError:
            raise ValueError(f"R4D_TMA_CUT={text!r}: expected 'cols,k_bytes,stages[,rows[,cluster_m,cluster_n]]', "
                             "three, four or six integers") from None
        cut = cls(*parts)
        if not (cut.cols in (112, 128, 256) and cut.rows in (64, 128, 192)
                and (cut.rows, cut.cols) not in ((192, 128), (64, 256), (64, 112), (192, 112))
                and cut.k_bytes in (32, 64, 128) and cut.stages >= 2 and cut.shared <= 65536
                and cut.cluster_m in (1, 2) and cut.cluster_n in (1, 2) and (cut.cluster == 1 or cut.producer)
                and (cut.cluster == 1 or cut.cols != 112)):
            raise ValueError(f"R4D_TMA_CUT={text!r}: cols 112, 128 or 256, rows 64, 128 or 192 (64 with 128 cols, 192 with "
                             f"256, 112 cols with 128 rows and no cluster), k_bytes 32, 64 or 128, stages >= 2, stages x "
                             f"((rows + cols) x k_bytes + 16) + 16 <= 65536, cluster_m and cluster_n 1 or 2 (clusters with "
                             f"a producer warp: 64 or 128 rows)")
        return cut


# The cuts bench/card_prefill_gemm.py --tma-cuts all compares, the first the default: 128 x 128 in 3
# stages of 64 bytes of K (two blocks a multiprocessor: six stages on it). Then SwiGLU's default
# (SWIGLU_CUT below), 128 x 112 in 2 stages of 128 bytes of K: past the 64 KiB a launch may have,
# 128 x 128 in 2 stages of 128 bytes ran the 8B shapes' GEMMs at M 2048 13 % faster than in 3 of 64,
# and 4 or 6 stages of 64 no faster than 3 (bench/results/h200_card_runs_2026-12-04d.md): what binds
# is the bytes of K a stage (four MMAs between a consumer's waits, not two; whole 128-byte lines a
# row), not the ring's depth. 112 columns bring that stage within 64 KiB with its barriers, for 0.81x
# a tile's time at 0.875x its flops: faster where a launch runs many waves of tiles (SwiGLU's 2 x
# 14336 columns: 16 waves of 264 blocks against 14), slower where a few whole waves become more
# (N = 4096: 592 tiles, 2.2 waves, against 512 in 1.9). Then 128 x 128 in 7 of 32
# (more, smaller loads ahead), 128 x 256 in 5 of 32, 192 x 256 in 4 of 32 and in 2 of 64 (one block).
# Why the wider ones: a block reads (rows + cols) x 2 bytes of L2 a K step for 2 rows cols flops, 1
# byte for 64 flops at 128 x 128 (~12 TB/s at the card's 790 TFLOP/s), for 85 at 128 x 256, for 110
# at 192 x 256 (~7 TB/s); gemm_wgmma.cu's 128 x 128 moved ~6 TB/s. Against that, 192 rows leave
# N = 4096 at 176 tiles, 1.3 waves of 132. Then the default's tile in clusters of 2 x 1, 1 x 2 and
# 2 x 2 blocks sharing their x and w tiles by TMA multicast: the same bits, 4-12 % slower on an H200
# (bench/results/h200_card_runs_2026-12-04c.md), so L2's bytes are not what binds the default. Last, 64 x
# 128 in 4 stages of 64 (one consumer warpgroup and a producer warp, four blocks a multiprocessor: 16
# stages on it against 128 x 128's 6, for 1.5x its L2 bytes a flop), alone and in 2 x 1 clusters
# sharing w's tile: 1.42x and 1.16x slower than 128 x 128 in 3 of 64 (h200_card_runs_2026-12-04d.md).
# Then the same 64 x 128 tile in 2 stages of 128 bytes of K (the stage that made 128 x 128 faster, at
# 48 KiB: four blocks a multiprocessor, 8 such stages on it), alone and in 2 x 1 clusters: checked on
# the host model and the fake card, not yet timed on a card.
TMA_CUTS = tuple(TmaCut.parse(text) for text in ("128,64,3", "112,128,2", "128,32,7", "256,32,5", "256,32,4,192", "256,64,2,192",
                                                  "128,64,3,128,2,1", "128,64,3,128,1,2", "128,64,3,128,2,2",
                                                  "128,64,4,64", "128,64,4,64,2,1", "128,128,2,64", "128,128,2,64,2,1"))
# R4D_TMA_CUT="cols,k_bytes,stages[,rows[,cluster_m,cluster_n]]" cuts gemm_tma.cu's work otherwise for a process; read at
# every launch's plan (the bench sets TMA_CUT between shapes)
TMA_CUT = TmaCut.parse(os.environ["R4D_TMA_CUT"]) if os.environ.get("R4D_TMA_CUT") else TMA_CUTS[0]
# The SwiGLU form's cut (and its maps'), R4D_TMA_SWIGLU_CUT in TmaCut's words: its launch runs many waves
SWIGLU_DEFAULT = TMA_CUTS[1]
SWIGLU_CUT = (TmaCut.parse(os.environ["R4D_TMA_SWIGLU_CUT"]) if os.environ.get("R4D_TMA_SWIGLU_CUT")
              else SWIGLU_DEFAULT)
TMA_ENTRIES = ("r4d_tma_gemm_bf16", "r4d_tma_gemm_e4m3", "r4d_tma_maps")
# gemm_tma.cu's forms over several weights of one x (the fused prefill rows'), compiled with the
# entry of the same R4D_TM_ONLY: q, k, v in one launch; gate and up paired, silu * mul in the epilogue
TMA_GROUP, TMA_SWIGLU, TMA_MAPS_GROUP = "r4d_tma_gemm_bf16_group", "r4d_tma_gemm_bf16_swiglu", "r4d_tma_maps_group"
TMA_ONLY = {**{name: at + 1 for at, name in enumerate(TMA_ENTRIES)}, TMA_GROUP: 1, TMA_SWIGLU: 1, TMA_MAPS_GROUP: 3}
MAP_BYTES = 128         # a CUtensorMap; r4d_tma_maps writes x's then w's into the scratch


@dataclass(frozen=True)
class SkinnyCut:
    """gemm_skinny.cu's cut: `warpgroups` of 128 threads a block (1 or 2), 64 of w's rows each (a
    block owns `rows` = 64 warpgroups rows of w, all of x's SK_MX = variant(M) rows), `k_bytes` of K
    a stage (128 or 64; where 128 leave fewer than MIN_STAGES stages, 64), `per_multiprocessor`
    blocks a multiprocessor (2, 3 or 4; 0: three where their registers allow, else two: `blocks`),
    and as many stages as fit a block's share of a multiprocessor's shared memory (`budget`: 64 KiB,
    RAD_MAX_SHARED_BYTES, at three blocks of an H200's 228 KiB; 55 KiB at four), at most MAX_STAGES:
    with one k-tile's MMAs running, stages - 1 k-tiles of copies are in flight a block. More blocks
    a multiprocessor keep more bytes in flight only while their stages stay as many."""
    warpgroups: int = 1
    k_bytes: int = 128
    per_multiprocessor: int = 0

    MIN_STAGES = 4
    MAX_STAGES = 8
    SHARED_PER_MULTIPROCESSOR = 233472  # an H200's (and H100's) 228 KiB; each block's 1 KiB of the system's out of it

    @property
    def rows(self) -> int:
        return 64 * self.warpgroups

    @property
    def threads(self) -> int:
        return 128 * self.warpgroups

    def blocks(self, mx: int) -> int:
        """Blocks a multiprocessor (__launch_bounds__): per_multiprocessor where given; else 3, but 2 for
        two warpgroups from SK_MX = 64 (3 x 256 threads leave 85 registers a thread: 32 accumulators
        spill there, 64 do not fit)."""
        return self.per_multiprocessor or (3 if self.warpgroups == 1 or mx <= 32 else 2)

    def budget(self, mx: int) -> int:
        """Shared memory a block may have: 64 KiB, or less where `blocks` of them would not fit."""
        return min(65536, self.SHARED_PER_MULTIPROCESSOR // self.blocks(mx) - 1024)

    def step(self, mx: int) -> int:
        """Bytes of K a stage for SK_MX = mx."""
        whole = self.budget(mx) // ((self.rows + mx) * self.k_bytes) >= self.MIN_STAGES
        return self.k_bytes if whole or self.k_bytes == 64 else 64

    def stages(self, mx: int) -> int:
        return min(self.MAX_STAGES, self.budget(mx) // ((self.rows + mx) * self.step(mx)))

    def shared(self, mx: int) -> int:
        return self.stages(mx) * (self.rows + mx) * self.step(mx)

    def defines(self, mx: int) -> tuple:
        """gemm_skinny.cu's macros for SK_MX = mx; WG_BN, WG_STAGES and WG_DEPTH only pass gemm_wgmma.cu's
        check of its own (its PTX and loader are built in, none of its entries)."""
        return (f"-DSK_MX={mx}", f"-DWG_WARPGROUPS={self.warpgroups}", f"-DWG_KB={self.step(mx)}",
                f"-DSK_STAGES={self.stages(mx)}", f"-DSK_BLOCKS={self.blocks(mx)}", "-DWG_BN=128", "-DWG_STAGES=2",
                "-DWG_DEPTH=1")

    def __str__(self) -> str:
        return f"{self.warpgroups},{self.k_bytes}" + (f",{self.per_multiprocessor}" if self.per_multiprocessor else "")

    @classmethod
    def parse(cls, text: str, variable: str = "R4D_SKINNY_CUT") -> "SkinnyCut":
        """'warpgroups,k_bytes[,blocks]' (R4D_SKINNY_CUT, or the band's R4D_BAND_CUT): ValueError naming the
        variable and what is wrong."""
        try:
            parts = [int(part) for part in text.split(",")]
            if len(parts) not in (2, 3):
                raise ValueError
        except ValueError:
            raise ValueError(f"{variable}={text!r}: expected 'warpgroups,k_bytes[,blocks]', two or three "
                             "integers") from None
        cut = cls(*parts)
        if (cut.warpgroups not in (1, 2) or cut.k_bytes not in (64, 128) or cut.per_multiprocessor not in (0, 2, 3, 4)
                or cut.warpgroups * cut.per_multiprocessor > 6):
            raise ValueError(f"{variable}={text!r}: warpgroups 1 or 2, k_bytes 64 or 128, blocks a "
                             "multiprocessor 2, 3 or 4 (two warpgroups at most 3: registers)")
        return cut


SKINNY_VARIANTS = (8, 16, 32, 64, 128)  # SK_MX: wgmma's N of bf16 that gemm_skinny.cu is built for (8: M <= 8, the bench's)
SKINNY_MAX_SPLITS = 16  # a block's few hundred KB of w: K cut finer than the tile kernels' to fill 132 x 3 blocks


def skinny_variant(m: int) -> int:
    """SK_MX for M rows of x: the next of 8, 16, 32, 64, 128 (128 past it: tiles of x along the grid's y;
    8 only where asked below the rows' band, as bench/card_prefill_gemm.py --gemv does)."""
    return next((mx for mx in SKINNY_VARIANTS if m <= mx), SKINNY_VARIANTS[-1])


# The cuts bench/card_prefill_gemm.py --skinny-cuts all compares, the first the default: one warpgroup
# (64 of w's rows a block: N / 64 blocks, 3 a multiprocessor), the same four a multiprocessor (in
# smaller stages), or two warpgroups (x read from L2 half as often)
SKINNY_CUTS = tuple(SkinnyCut.parse(text) for text in ("1,128", "1,128,4", "2,128"))
# R4D_SKINNY_CUT="warpgroups,k_bytes[,blocks]" cuts gemm_skinny.cu's work otherwise for a process; read at every
# launch's plan (the bench sets SKINNY_CUT between shapes)
SKINNY_CUT = SkinnyCut.parse(os.environ["R4D_SKINNY_CUT"]) if os.environ.get("R4D_SKINNY_CUT") else SKINNY_CUTS[0]
SKINNY_ENTRY = "r4d_skinny_gemm_bf16"


def wgmma_cut(kind: str) -> WgmmaCut:
    """The cut gemm_wgmma.cu's entry of `kind` runs with now (WGMMA_CUT, as that kind takes it)."""
    return WGMMA_CUT.for_kind(kind)


def hopper_cut(kernel: str, kind: str) -> "WgmmaCut | TmaCut | None":
    """The cut in force of a Hopper tile kernel (wgmma's for the kind, TMA's), None for mma.sync's
    fixed tiles: both cuts say rows, cols, k_bytes, threads, blocks (a multiprocessor) and shared."""
    return wgmma_cut(kind) if kernel == "wgmma" else TMA_CUT if kernel == "tma" else None


def tile_m(m: int, kernel: str = "mma", kind: str = "bf16") -> int:
    """Rows of x a block's tile: mma.sync 64 for batched decode's few rows, 128 for prefill; wgmma's
    and TMA's their cut's (128 or 192); the skinny kernel's SK_MX (16 .. 128)."""
    if kernel == "skinny":
        return skinny_variant(m)
    cut = hopper_cut(kernel, kind)
    return cut.rows if cut else 128 if m > 64 else 64


def tile_n(kernel: str = "mma", kind: str = "bf16") -> int:
    """Columns of a block's tile (w's rows): mma.sync 128, wgmma's and TMA's their cut's (128 or
    256), the skinny kernel's 64 a warpgroup."""
    if kernel == "skinny":
        return SKINNY_CUT.rows
    cut = hopper_cut(kernel, kind)
    return cut.cols if cut else TILE_N


def k_tile(kind: str, kernel: str = "mma", m: int = 0) -> int:
    """K elements of one shared-memory step: 64 bytes for mma.sync (32 bf16, 64 e4m3), the cut's
    k_bytes for wgmma and TMA (128: 64 bf16, 128 e4m3; 64; 32), the skinny kernel's for M's SK_MX."""
    if kernel == "skinny":
        return SKINNY_CUT.step(skinny_variant(m)) // 2
    cut = hopper_cut(kernel, kind)
    step = cut.k_bytes if cut else 64
    return step // 2 if kind == "bf16" else step


def split(m: int, n: int, k: int, kind: str, kernel: str = "mma") -> tuple[int, int]:
    """(splits, k-tiles a split): K cut where the output tiles alone give fewer than a wave's blocks
    (TARGET_BLOCKS for mma.sync, MULTIPROCESSORS x the cut's blocks a multiprocessor for wgmma and TMA),
    into at most ceil(target / tiles) splits (and MAX_SPLITS), each at least
    MIN_TILES_PER_SPLIT tiles, none empty: of those counts the one that takes the fewest k-tile
    steps end to end, ceil(tiles * splits / target) waves of ceil(steps / splits) steps (the
    fewest splits of equals). So 128 tiles take 2 splits (256 blocks, one wave of 32 steps), not 3
    (384 blocks, two waves of 22: 44). The skinny kernel: 132 x its blocks, up to SKINNY_MAX_SPLITS.
    From shapes and the kernel only, so every card of a kind adds the same partial sums in the same
    order."""
    tiles = -(-m // tile_m(m, kernel, kind)) * -(-n // tile_n(kernel, kind))
    cut = hopper_cut(kernel, kind)
    blocks = SKINNY_CUT.blocks(skinny_variant(m)) if kernel == "skinny" else cut.blocks if cut else 0
    target = MULTIPROCESSORS * blocks or TARGET_BLOCKS
    most = SKINNY_MAX_SPLITS if kernel == "skinny" else MAX_SPLITS
    return split_tiles(tiles, -(-k // k_tile(kind, kernel, m)), target, most)


def split_tiles(tiles: int, steps: int, target: int, most: int) -> tuple[int, int]:
    """split's choice for `tiles` output tiles of `steps` k-tiles each, a wave of `target` blocks, at
    most `most` splits: (splits, k-tiles a split)."""
    best, best_steps = 1, None
    for splits in range(1, max(1, min(-(-target // tiles), most, steps // MIN_TILES_PER_SPLIT)) + 1):
        per = -(-steps // splits)
        count = -(-steps // per)  # the splits that are not empty
        along = -(-tiles * count // target) * per
        if best_steps is None or along < best_steps:
            best, best_steps = count, along
    per = -(-steps // best)
    return -(-steps // per), per


# ---- the decode band on Hopper (device_skinny_band.py): gemm_skinny.cu's r4d_skinny_band_bf16 for the GEMV
# rows and their fused forms (device_rows.py) at M = BAND_FROM .. GEMV_MAX_M, bf16 weights, sm_90.
# Why: at M = 8 gemv.cu's tensor-core path read a layer's 8B weights at 39-58 % of HBM (185 us a layer,
# bench/results/h200_card_runs_2026-12-03h.md), the skinny GEMM's SK_MX 8 at 135. x crosses as hi and
# lo bf16 rows (SK_MX 16: BAND_MX), so the rows keep the GEMV's tolerance (device_kernels.TOLERANCE),
# not the bf16 row's. M = 1 stays on gemv.cu (a 16-row MMA for one row of x, and its folded norm needs
# no launch of its own). R4D_BAND_KERNEL=gemv|skinny forces one for a process (the bench compares them;
# skinny only where the card is an sm_90 and the weights bf16).
BAND_MX = 16
BAND_FROM = 2
BAND_KERNELS = ("gemv", "skinny")
BAND_KERNEL = os.environ.get("R4D_BAND_KERNEL") or None
BAND_ENTRY = "r4d_skinny_band_bf16"
BAND_MODES = (0, 1, 2, 3)  # the epilogues: store (up to three weights), add into the residual, silu * mul of gate and
# up, store with each block's first maximum (the lm head's, for r4d_sample_groups_dev)


# The band's cut of gemm_skinny.cu (SkinnyCut; R4D_BAND_CUT="warpgroups,k_bytes[,blocks]" for a process): one
# warpgroup, four blocks a multiprocessor. On an H200 that cut at SK_MX 16 (M = 16: the band's geometry)
# read a layer's four 8B GEMMs in 132.5 us against 141.0 at three blocks (bench/results/
# h200_card_runs_2026-12-03h.md, call 2), and 528 blocks a wave take the fused gate and up's 448 row
# blocks in one wave (three blocks a multiprocessor, 396: a second wave of 52).
BAND_CUT = SkinnyCut.parse(os.environ.get("R4D_BAND_CUT") or "1,128,4", "R4D_BAND_CUT")
# 256: the band's weight copies ask the L2 for 256-byte blocks (cp.async's L2::256B: a row's next k-tile comes
# with this one, as gemv.cu's loads fetch 256 bytes); 0: plain copies. R4D_BAND_L2 for a process; 0 until
# bench/card_band.py --variants shows the card's answer.
BAND_L2S = (0, 256)
BAND_L2 = int(os.environ.get("R4D_BAND_L2") or 0)
if BAND_L2 not in BAND_L2S:
    raise ValueError(f"R4D_BAND_L2={BAND_L2}: 0 or 256")


def band_kernel_for(vendor: str, target: str, fmt: str, m: int) -> str:
    """'skinny' or 'gemv' for the decode band's GEMV of `m` rows of x (1 .. GEMV_MAX_M) of `fmt` weights."""
    if BAND_KERNEL is not None and BAND_KERNEL not in BAND_KERNELS:
        raise ValueError(f"R4D_BAND_KERNEL={BAND_KERNEL!r}: one of {', '.join(BAND_KERNELS)}")
    hopper = vendor == "cuda" and sm_of(target) == 90 and fmt == "bf16" and 1 <= m <= GEMV_MAX_M
    if BAND_KERNEL is not None:
        return "skinny" if BAND_KERNEL == "skinny" and hopper else "gemv"
    return "skinny" if hopper and m >= BAND_FROM else "gemv"


def band_tiles(rows: tuple, mode: int) -> int:
    """Blocks along the grid's x: each weight's ceil(rows / BAND_CUT.rows) (mode 2: gate's rows with
    up's beside them, half a block's rows each)."""
    block = BAND_CUT.rows
    if mode == 2:
        return -(-rows[0] // (block // 2))
    return sum(-(-r // block) for r in rows)


def band_split(rows: tuple, k: int, mode: int) -> tuple[int, int]:
    """(splits, k-tiles a split) of a band launch: split's rule for its tiles at SK_MX = BAND_MX."""
    steps = -(-k // (BAND_CUT.step(BAND_MX) // 2))
    return split_tiles(band_tiles(rows, mode), steps, MULTIPROCESSORS * BAND_CUT.blocks(BAND_MX), SKINNY_MAX_SPLITS)


def band_scratch_layout(m: int, rows: tuple, k: int, mode: int, base: int = 0) -> dict:
    """Offsets in the row's scratch from `base` (the GEMV's own layout ends there: neither kernel's
    split counters ever lie under the other's partials): a u32 counter a block where K is split
    (zero between launches), the partials [splits, M, tiles x BAND_CUT.rows] f32, the 16 hi and lo
    bf16 rows [16, K] ("rows"), and the total."""
    splits, _ = band_split(rows, k, mode)
    tiles, at, layout = band_tiles(rows, mode), _aligned(base), {}
    if splits > 1:
        layout["counters"], at = at, _aligned(at + 4 * tiles)
        layout["partial"], at = at, _aligned(at + 4 * splits * m * tiles * BAND_CUT.rows)
    layout["rows"], at = at, _aligned(at + 2 * BAND_MX * k)
    layout["total"] = at
    return layout


def band_options(mode: int) -> tuple:
    return ("--gpu-architecture=sm_90a", "-DR4D_WG_ONLY=3", *BAND_CUT.defines(BAND_MX), "-DSK_BAND=1", f"-DSK_MODE={mode}",
            f"-DSK_L2={BAND_L2}")


ENTRIES = ("r4d_mma_gemm_bf16_m64", "r4d_mma_gemm_bf16_m128", "r4d_mma_gemm_e4m3_m64", "r4d_mma_gemm_e4m3_m128")
WGMMA_ENTRIES = ("r4d_wgmma_gemm_bf16", "r4d_wgmma_gemm_e4m3")


def entry(kind: str, m: int, kernel: str = "mma") -> str:
    if kernel == "skinny":
        if kind != "bf16":
            raise ValueError(f"gemm_skinny.cu is bf16's, not {kind}'s")
        return SKINNY_ENTRY
    if kernel in ("wgmma", "tma"):
        return f"r4d_{kernel}_gemm_{kind}"
    return f"r4d_mma_gemm_{kind}_m{tile_m(m)}"


def source(kernel: str) -> str:
    return {"wgmma": "gemm_wgmma", "tma": "gemm_tma", "skinny": "gemm_skinny"}.get(kernel, "gemm_mma")


def options(name: str, m: int = 0, cut: TmaCut | None = None) -> tuple:
    """Compile only the entry a launch needs: each takes nvrtc seconds (R4D_TC_ONLY, R4D_WG_ONLY);
    wgmma needs sm_90a, which replaces the card's sm_90 (radiance.device.cuda.nvrtc_compile), and
    its cut's macros; the skinny kernel its cut's for M's SK_MX; gemm_tma.cu's entries `cut`'s
    (default TMA_CUT; the SwiGLU form and its maps' launch are planned in form_cut(True))."""
    if name == SKINNY_ENTRY:
        return ("--gpu-architecture=sm_90a", "-DR4D_WG_ONLY=3", *SKINNY_CUT.defines(skinny_variant(m)))
    if name in WGMMA_ENTRIES:
        kind = KINDS[WGMMA_ENTRIES.index(name)]
        return ("--gpu-architecture=sm_90a", f"-DR4D_WG_ONLY={WGMMA_ENTRIES.index(name) + 1}", *wgmma_cut(kind).defines(),
                f"-DWG_GROUP={WGMMA_GROUP}", *(() if WG_PAIRS else ("-DWG_PAIRS=0",)))
    if name in TMA_ONLY:  # gemm_wgmma.cu's PTX before it, none of its entries (R4D_WG_ONLY=3)
        return ("--gpu-architecture=sm_90a", "-DR4D_WG_ONLY=3", f"-DR4D_TM_ONLY={TMA_ONLY[name]}",
                *tma_defines(cut or TMA_CUT), f"-DWG_GROUP={WGMMA_GROUP}",
                *(() if WG_PAIRS else ("-DWG_PAIRS=0",)))
    return (f"-DR4D_TC_ONLY={ENTRIES.index(name) + 1}",)


def tma_defines(cut: TmaCut, release: str = "") -> tuple:
    """gemm_tma.cu's macros for `cut` and the consumers' release (TMA_RELEASE unless given): early
    (TM_EARLY) where the cut has a producer warp (64 or 128 rows); the 192-row cut's loader releases late."""
    early = (release or TMA_RELEASE) == "early" and cut.producer
    return (*cut.defines(), *(("-DTM_EARLY=1",) if early else ()))


def grid(m: int, n: int, splits: int, kernel: str = "mma", kind: str = "bf16") -> tuple:
    """mma.sync: (column tiles, row tiles, splits) of 256 threads; wgmma: (tiles, 1, splits) of the
    cut's threads, the kernel ordering its tiles in groups of WGMMA_GROUP row tiles (gemm_wgmma.cu's
    WG_GROUP); TMA's the same of its cut's threads; the skinny kernel (w's row blocks, x's tiles,
    splits) of its cut's. Either way a split-K counter a tile."""
    if kernel == "skinny":
        return (-(-n // SKINNY_CUT.rows), -(-m // skinny_variant(m)), splits), (SKINNY_CUT.threads, 1, 1)
    cut = hopper_cut(kernel, kind)
    if kernel == "tma":  # in its clusters
        return (cut.blocks_for(m, n), 1, splits), (cut.threads, 1, 1)
    if cut:
        return (-(-n // cut.cols) * -(-m // cut.rows), 1, splits), (cut.threads, 1, 1)
    return (-(-n // TILE_N), -(-m // tile_m(m, kernel)), splits), (THREADS, 1, 1)


def has_groups(cut: TmaCut) -> bool:
    """Whether gemm_tma.cu builds the grouped and SwiGLU forms in `cut` (one or two consumer
    warpgroups and a producer warp, 112 or 128 columns)."""
    return cut.producer and cut.cols in (112, 128)


def form_cut(swiglu: bool) -> TmaCut:
    """The cut a grouped (TMA_CUT) or SwiGLU (SWIGLU_CUT) launch and its maps' launch are planned in."""
    return SWIGLU_CUT if swiglu else TMA_CUT


def groups_serve() -> bool:
    """Whether this process's cuts have both forms (the grouped in TMA_CUT, SwiGLU's in SWIGLU_CUT)."""
    return has_groups(form_cut(False)) and has_groups(form_cut(True))


def refuse_without_groups(entry: str, cut: TmaCut) -> None:
    """A plan of a grouped or SwiGLU launch in a cut gemm_tma.cu builds them not in (its kernel traps)."""
    if not has_groups(cut):
        raise ValueError(f"{entry}: the TMA cut {cut} has no grouped or SwiGLU forms (only a cut of 64 or 128 rows "
                         f"and 112 or 128 columns does: R4D_TMA_CUT={TMA_CUTS[0]} and R4D_TMA_SWIGLU_CUT={SWIGLU_DEFAULT}, "
                         f"the defaults)")


def group_grid(m: int, rows: tuple) -> tuple:
    """r4d_tma_gemm_bf16_group's grid and block: every weight's tiles of the cut, one after another."""
    refuse_without_groups(TMA_GROUP, TMA_CUT)
    if not 1 <= len(rows) <= 3:
        raise ValueError(f"{TMA_GROUP}: 1 to 3 weights of one x, not {len(rows)}")
    return (sum(TMA_CUT.blocks_for(m, n) for n in rows), 1, 1), (TMA_CUT.threads, 1, 1)


def swiglu_grid(m: int, n: int) -> tuple:
    """r4d_tma_gemm_bf16_swiglu's: tiles of SWIGLU_CUT's rows by half its columns of outputs (a tile's
    columns are that many of gate's weight and as many of up's)."""
    cut = form_cut(True)
    refuse_without_groups(TMA_SWIGLU, cut)
    return (cut.blocks_for(m, n, cut.cols // 2), 1, 1), (cut.threads, 1, 1)


def shared_bytes(m: int, kernel: str = "mma", kind: str = "bf16") -> int:
    """Dynamic shared memory: gemm_mma.cu's TC_STAGES stages of an A and a B tile, or
    gemm_wgmma.cu's stages of swizzled x and w tiles (no slack: the kernel has no static shared
    memory, so its dynamic area starts 1024-aligned); gemm_tma.cu's stages and mbarriers;
    gemm_skinny.cu's stages of w's and x's rows for M's SK_MX."""
    if kernel == "skinny":
        return SKINNY_CUT.shared(skinny_variant(m))
    cut = hopper_cut(kernel, kind)
    return cut.shared if cut else STAGES * (tile_m(m) + TILE_N) * ROW_BYTES


def narrow_grid(m: int, k: int) -> tuple:
    """r4d_narrow_bf16_dev's grid and block over M * K values (a grid-stride loop past the cap)."""
    return (max(1, min(NARROW_MAX_BLOCKS, -(-m * k // (8 * NARROW_THREADS)))), 1, 1), (NARROW_THREADS, 1, 1)


def narrows(kind: str, kernel: str) -> bool:
    """Whether x goes through the scratch as bf16 rows first: gemm_wgmma.cu's, gemm_tma.cu's and
    gemm_skinny.cu's bf16 kinds read both operands as bytes (gemm_mma.cu narrows its f32 x itself)."""
    return kind == "bf16" and kernel in ("wgmma", "tma", "skinny")


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


# The split-K counters' region at the start of the row's scratch, the same for every M and kernel:
# the engine gives a row one scratch for all its steps, and a kernel's last split leaves its tiles'
# counters zero for the next launch, so no other step's rows or partials may ever land there (laid
# where each M's layout began, a 2048-row step's bf16 rows or a streamed step's partials were found
# in them). K is split only where the tiles are fewer than a wave's blocks (split), at most
# MULTIPROCESSORS x 4 (the skinny kernel's most blocks a multiprocessor): 1024 covers it.
COUNTERS = 1024
COUNTER_BYTES = 4 * COUNTERS


def scratch_layout(m: int, n: int, k: int, kind: str, kernel: str = "mma") -> dict:
    """Offsets in the row's scratch: split-K counters (a u32 a tile, in the COUNTERS region) and
    partial sums [splits, M, N] f32 where K is split; for e4m3, x's codes [M, K] and row scales [M];
    for wgmma's and TMA's bf16, x's bf16 rows [M, K] ("codes"; the skinny kernel's too); for TMA, the
    two tensor maps (x's, w's: "maps"); and the total. Everything but the counters from COUNTER_BYTES."""
    splits, _ = split(m, n, k, kind, kernel)
    at, layout = COUNTER_BYTES, {}
    if splits > 1:
        (tx, ty, _), _ = grid(m, n, splits, kernel, kind)
        if tx * ty > COUNTERS:
            raise ValueError(f"a split GEMM of {tx * ty} tiles ({m} x {n}, {kernel}): the scratch keeps {COUNTERS} counters")
        layout["counters"] = 0
        layout["partial"], at = at, _aligned(at + 4 * splits * m * n)
    if kind == "e4m3":
        layout["codes"], at = at, _aligned(at + m * k)
        layout["scales"], at = at, _aligned(at + 4 * m)
    elif narrows(kind, kernel):
        layout["codes"], at = at, _aligned(at + 2 * m * k)
    if kernel == "tma":
        layout["maps"], at = at, _aligned(at + 2 * MAP_BYTES)
    layout["total"] = at
    return layout


def scratch_bytes(max_m: int, n: int, k: int, kind: str) -> int:
    """The most any M of the band [GEMV_MAX_M + 1, max_m] needs with any tensor-core kernel (the
    split, so the partials, vary with M and the kernel; the hook does not know the card)."""
    return max((scratch_layout(m, n, k, kind, kernel)["total"] for kernel in TC_KERNELS
                if kind == "bf16" or kernel != "skinny"
                for m in range(GEMV_MAX_M + 1, max(max_m, GEMV_MAX_M + 1) + 1)), default=0)
