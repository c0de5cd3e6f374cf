"""libr4d's device rows for the GGUF block types imported as bit-stream encodings (rows_kquants.FORMATS:
q4_0, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k), the planes read as stored: a decode GEMV row
(M <= 8) and a prefill row (M >= 9) per format, both device/gemv_gguf.cu's kernel (a launch compiles
its format's entries): the prefill row launches its 8-row entry over ceil(M / 8) chunks of M in one grid, each
chunk streaming the weight again; and an embedding row for all of them (each value the core decoder's,
bit for bit). q8_0 and q4_1 keep device_rows.py's rows.

Within the GEMV tolerance of libref (device_kernels.TOLERANCE['gemv']): each weight value is the
core decoder's, the dot products are per sub-block sums in f32 (docs/LIBR4D.md 'Device rows')."""

from radiance.abi import (
    RAD_CDIV, RAD_CEQ, RAD_CGE, RAD_CIN, RAD_CLE, RAD_DOMAIN_DEVICE, KernelArgs, RadKernelInfo, RadTensor,
)

from . import device_kernels as dk
from .device_rows import F32_ACTIVATIONS, Step, _address, _planned, chained
from .rows_kquants import FORMATS, _layout, _layout_any, encoding_format

SOURCE = "gemv_gguf"
WARPS, ROWS = 4, 2          # gemv_gguf.cu's KQ_WARPS, KQ_ROWS: a block owns 8 output rows
CHUNK = dk.GEMV_MAX_M       # the activation rows one entry carries at most (MT = 8)
PLANES = ("codes", "scale", "scale.1", "min", "min.1")  # the pointers the kernel takes, in order


class GgufWeight:
    """A GGUF block-type weight on the card: rows_kquants' format name and code, its plane addresses."""

    def __init__(self, operand):
        weight = operand.data if isinstance(operand, RadTensor) else operand
        fmt = encoding_format(getattr(weight, "encoding", None))
        if fmt is None:
            raise ValueError("libr4d: a weight in an encoding the GGUF device rows do not read")
        code, block = FORMATS[fmt][:2]
        self.fmt, self.code, self.rows, self.cols = fmt, code, int(weight.rows), int(weight.cols)
        if self.cols % block:
            raise ValueError(f"libr4d: a {fmt} weight of {self.cols} columns (not a multiple of {block})")
        found = {spec.name: _address(tensor) for spec, tensor in zip(weight.encoding.planes, weight.planes)}
        self.planes = [found.get(name, 0) for name in PLANES]


def entry(fmt: str, m: int) -> str:
    """The entry for M activation rows: m1, m2, m4 or m8 (M > 8: m8 over chunks of M)."""
    return f"r4d_kq_gemv_{fmt}_m{dk.gemv_variant(min(m, CHUNK))}"


def grid(m: int, n: int, warp: int = 32) -> tuple:
    """(blocks of 8 output rows, 1, chunks of 8 activation rows), KQ_WARPS warps a block."""
    return (-(-n // (WARPS * ROWS)), 1, -(-m // CHUNK)), (WARPS * warp, 1, 1)


def options(fmt: str) -> tuple:
    return (f"-DR4D_KQ_ONLY={FORMATS[fmt][0]}", f"-DKQ_WARPS={WARPS}", f"-DKQ_ROWS={ROWS}")


def gemv_step(a, x: int, weight, y: int) -> Step:
    w, m = GgufWeight(weight), int(a.params["M"])
    name = entry(w.fmt, m)
    blocks, block = grid(m, w.rows, dk.warp_size(getattr(a.stream, "vendor", "")))
    args = KernelArgs(name).pointer(x).i32(m).i32(w.cols)
    for plane in w.planes:
        args.pointer(plane)
    args.pointer(y).i32(w.rows)
    return Step(name, SOURCE, blocks, block, args, 0, options(w.fmt))


def _gemm(a):
    x, weight, y = a.t
    return [gemv_step(a, _address(x), weight, _address(y))]


def _embedding(a):
    ids, table, y = a.t
    w, m = GgufWeight(table), int(a.params["M"])
    name = f"r4d_kq_embedding_{w.fmt}"
    grid, block = dk.rows_grid(m, w.cols)
    args = KernelArgs(name).pointer(_address(ids))
    for plane in w.planes:
        args.pointer(plane)
    args.i32(w.rows).i32(w.cols).pointer(_address(y))
    return [Step(name, SOURCE, grid, block, args, 0, options(w.fmt))]


def build_rows() -> list[RadKernelInfo]:
    found = []
    for fmt, (_, block, _, _) in FORMATS.items():
        common = [F32_ACTIVATIONS, RAD_CIN("wdtype", fmt), RAD_CEQ("split_k", 1), RAD_CDIV("K", block)]
        for name, band, shape, computes in (
                (f"r4d_gemv_{fmt}_dev", RAD_CLE("M", dk.GEMV_MAX_M), f"M<={dk.GEMV_MAX_M}",
                 "decode GEMV: a warp per 2 output rows, 32-element groups of codes a lane, per sub-block sums"),
                (f"r4d_gemm_{fmt}_dev", RAD_CGE("M", dk.GEMV_MAX_M + 1), f"M>={dk.GEMV_MAX_M + 1}",
                 "prefill: the decode GEMV's 8-row entry over chunks of 8 rows of M, the weight streamed per chunk")):
            found.append(RadKernelInfo(
                name=chained(name), op="gemm", family="r4d", computes=f"{computes} (device/gemv_gguf.cu)",
                shape=f"{shape}, K%{block}==0", dtypes=f"f32 x {fmt}", domain=RAD_DOMAIN_DEVICE, priority=10,
                constraints=[band, *common], launch=_planned(name, _gemm), layout=_layout(fmt)))
    formats = " ".join(FORMATS)
    found.append(RadKernelInfo(
        name=chained("r4d_embedding_gguf_dev"), op="embedding", family="r4d",
        computes="table rows decoded to f32 exactly, a thread an element (device/gemv_gguf.cu)",
        shape="n a whole number of blocks", dtypes=f"{formats} table", domain=RAD_DOMAIN_DEVICE, priority=10,
        constraints=[F32_ACTIVATIONS, RAD_CIN("wdtype", formats)], launch=_planned("r4d_embedding_gguf_dev", _embedding),
        layout=_layout_any))
    return found
