"""gemm_streamed.cu's geometry, host-checkable (no card): which launches it serves, its entries, the
cut of its work, the split of K and the scratch layout (device_batch_rows.py builds the launches;
docs/LIBR4D.md "Tensor cores").

The streamed GEMM serves the tensor-core gemm rows for M = 9..64 (batched decode) on NVIDIA cards
from sm_80 (e4m3 weights from sm_89): weights streamed once into registers as mma.sync's A operand,
x through shared memory as bf16 (the rows' contract, device_tensor_cores.TOLERANCE). Unless
R4D_STREAMED_GEMM says otherwise, it serves M <= 32 in its default cut (below), except where
device_tensor_cores.kernel_for gives the skinny kernel (Hopper, bf16), which is faster there; 1 or a
cut 'warps,tiles,stage,pipe[,chunks]' serves every M <= 64, the skinny kernel's too, 0 turns it off
(bench/card_prefill_gemm.py --tokens 16 32 64 --streamed ... times the cuts)."""

import os
from dataclasses import dataclass

MAX_M = 64              # the entries carry MT = 16, 32 or 64 activation rows
VARIANTS = (16, 32, 64)
KINDS = ("bf16", "e4m3")
MAX_SPLITS = 16         # gemm_streamed.cu's GS_MAX_SPLITS: r4d_streamed_reduce's loads in flight a thread
MIN_STAGES_PER_SPLIT = 4
REDUCE = "r4d_streamed_reduce"
REDUCE_THREADS = 256
REDUCE_MAX_BLOCKS = 1024


@dataclass(frozen=True)
class StreamedCut:
    """gemm_streamed.cu's cut (its GS_* macros): `warps` warps a block, `tiles` m16 tiles of weight
    rows a warp (a block owns 16 tiles warps rows), `stage` K elements of x a shared-memory stage,
    `pipe` k-steps of weights a lane keeps in flight, `chunks` 16-byte loads a lane takes of a bf16
    row a step (2: a row's four lanes read 128 contiguous bytes a step, not 64; e4m3 takes one)."""
    warps: int = 8
    tiles: int = 2
    stage: int = 64
    pipe: int = 2
    chunks: int = 1

    @property
    def rows(self) -> int:
        return 16 * self.tiles * self.warps

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def defines(self) -> tuple:
        return (f"-DGS_WARPS={self.warps}", f"-DGS_TILES={self.tiles}", f"-DGS_STAGE={self.stage}",
                f"-DGS_PIPE={self.pipe}", f"-DGS_CHUNKS={self.chunks}")

    def __str__(self) -> str:
        return f"{self.warps},{self.tiles},{self.stage},{self.pipe}" + (f",{self.chunks}" if self.chunks != 1 else "")

    def blocks_a_multiprocessor(self, m: int, kind: str) -> int:
        """The blocks of M's entry a multiprocessor holds (the kernel's __launch_bounds__): MT = 64's
        accumulators, and e4m3's decoded fragments at MT = 32, leave registers for 8 warps; the
        others for 16."""
        return max(1, (8 if variant(m) == 64 or (kind == "e4m3" and variant(m) == 32) else 16) // self.warps)

    @classmethod
    def parse(cls, text: str) -> "StreamedCut":
        """'warps,tiles,stage,pipe[,chunks]' (R4D_STREAMED_GEMM; '1': the default cut): ValueError
        naming what is wrong."""
        if text.strip() == "1":
            return cls()
        try:
            parts = [int(part) for part in text.split(",")]
            if len(parts) not in (4, 5):
                raise ValueError
        except ValueError:
            raise ValueError(f"R4D_STREAMED_GEMM={text!r}: expected '1' or 'warps,tiles,stage,pipe[,chunks]', "
                             "four or five integers") from None
        cut = cls(*parts)
        if not (cut.warps in (1, 2, 4, 8) and 1 <= cut.tiles <= 2 and cut.stage in (64, 128, 192, 256)
                and 1 <= cut.pipe <= 4 and cut.chunks in (1, 2)):
            raise ValueError(f"R4D_STREAMED_GEMM={text!r}: warps 1, 2, 4 or 8, tiles 1 or 2, stage 64, 128, 192 "
                             "or 256, pipe 1..4, chunks 1 or 2")
        return cut


@dataclass(frozen=True)
class Serving:
    """What a process serves with the streamed GEMM: launches of M <= `most` rows, in `cut`; where the
    card's kernel would be the skinny GEMM, only if `over_skinny`."""
    cut: StreamedCut
    most: int = MAX_M
    over_skinny: bool = True


# Unset: the default cut serves M <= DEFAULT_MAX_M, where an H200 timed it 1.0-3.4x the tile GEMM on
# every 8B shape (batch 32's decode step 19.88 -> 16.49 ms); at M = 64 the lm head took 0.61x the tile
# GEMM's speed, so M = 33..64 stays on the tile GEMM (bench/results/h200_card_runs_2026-12-03f.md).
# Not where the skinny kernel serves (Hopper, bf16): there an 8B decode step at batch 16 / 32 took
# 8.31 / 10.45 ms on it against 9.00 / 13.22 on the streamed GEMM, same call (h200_card_runs_2026-12-04.md).
# R4D_STREAMED_GEMM=1 (or a cut) serves every M <= MAX_M, 0 leaves it off (SERVING None). SERVING is
# read at every launch's plan, so the bench sets it between shapes to compare cuts in one run.
DEFAULT_MAX_M = 32
_SETTING = os.environ.get("R4D_STREAMED_GEMM", "").strip()
SERVING = (None if _SETTING == "0" else Serving(StreamedCut.parse(_SETTING)) if _SETTING
           else Serving(StreamedCut(), DEFAULT_MAX_M, over_skinny=False))
MULTIPROCESSORS = 132   # an H200's: the waves the split plans for, whatever the card (the same sums everywhere)


def serves(kernel: str, kind: str, m: int) -> bool:
    """Whether the streamed GEMM takes this launch: turned on, a card with mma.sync for the kind
    (device_tensor_cores.kernel_for gave 'wgmma', 'tma', 'mma', or 'skinny' where SERVING.over_skinny),
    and M <= SERVING.most."""
    kernels = ("wgmma", "tma", "skinny", "mma") if SERVING is not None and SERVING.over_skinny else ("wgmma", "tma", "mma")
    return SERVING is not None and kernel in kernels and kind in KINDS and m <= SERVING.most


def variant(m: int) -> int:
    """The activation rows an entry carries for M: the next of 16, 32, 64."""
    for mt in VARIANTS:
        if m <= mt:
            return mt
    raise ValueError(f"the streamed GEMM serves M <= {MAX_M}, not {m}")


ENTRIES = tuple(f"r4d_streamed_gemm_{kind}_m{mt}" for kind in KINDS for mt in VARIANTS)


def entry(kind: str, m: int) -> str:
    return f"r4d_streamed_gemm_{kind}_m{variant(m)}"


def options(name: str, cut: StreamedCut) -> tuple:
    """Only the entry a launch needs (GS_ONLY), in the cut's macros."""
    return (f"-DGS_ONLY={ENTRIES.index(name) + 1}", *cut.defines())


def split(m: int, n: int, k: int, kind: str, cut: StreamedCut, multiprocessors: int = MULTIPROCESSORS) -> tuple[int, int]:
    """(splits, K elements a split: whole stages): K cut where the row blocks alone give fewer than a
    wave (multiprocessors x the blocks each holds), into at most MAX_SPLITS splits of at least
    MIN_STAGES_PER_SPLIT stages, none empty: of those the count whose blocks take the fewest
    stages end to end, ceil(blocks * splits / wave) waves of ceil(stages / splits) stages (the
    fewest splits of equals: each split adds M x N partial sums to write and read back). From shapes
    and the cut only, so every card adds the same partial sums in the same order."""
    blocks = -(-n // cut.rows)
    wave = max(1, multiprocessors) * cut.blocks_a_multiprocessor(m, kind)
    stages = -(-k // cut.stage)
    best, best_along = 1, None
    for splits in range(1, max(1, min(-(-wave // blocks), MAX_SPLITS, stages // MIN_STAGES_PER_SPLIT)) + 1):
        per = -(-stages // splits)
        count = -(-stages // per)  # the splits that are not empty
        along = -(-blocks * count // wave) * per
        if best_along is None or along < best_along:
            best, best_along = count, along
    per = -(-stages // best)
    return -(-stages // per), per * cut.stage


def grid(n: int, splits: int, cut: StreamedCut) -> tuple:
    """(row blocks, 1, splits) of the cut's threads."""
    return (-(-n // cut.rows), 1, splits), (cut.threads, 1, 1)


def reduce_grid(m: int, n: int) -> tuple:
    """r4d_streamed_reduce over M x N outputs, 4 a thread (1 where M N % 4 != 0), a grid-stride
    loop past REDUCE_MAX_BLOCKS."""
    units = m * n // 4 if m * n % 4 == 0 else m * n
    return (max(1, min(REDUCE_MAX_BLOCKS, -(-units // REDUCE_THREADS))), 1, 1), (REDUCE_THREADS, 1, 1)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 256) * 256


def scratch_layout(m: int, n: int, k: int, kind: str, cut: StreamedCut) -> dict:
    """Offsets in the row's scratch where K is split: the partial sums [splits, M, N] f32 that
    r4d_streamed_reduce adds; and the total (0 unsplit)."""
    splits, _ = split(m, n, k, kind, cut)
    if splits == 1:
        return {"total": 0}
    return {"partial": 0, "total": _aligned(4 * splits * m * n)}


def scratch_bytes(max_m: int, n: int, k: int, kind: str, cut: StreamedCut | None = None) -> int:
    """The most any M of [9, min(max_m, MAX_M)] needs in `cut` (SERVING's, else the default cut)."""
    cut = cut or (SERVING.cut if SERVING else StreamedCut())
    return max((scratch_layout(m, n, k, kind, cut)["total"] for m in range(9, min(max_m, MAX_M) + 1)), default=0)
