"""The weight formats libr4d's device rows read as stored: those of the host rows (rows.py: q4_1,
q8_0, plain f32, f16, bf16) and OCP e4m3 codes with f32 scales, `fp8_channel` (a scale per output
row, the fp8 quantiser's `scale = "channel"`) or `fp8` (one scale for the whole weight). The kernels
know both fp8 forms by their format code (device/common.cu: FMT_FP8_ROW, FMT_FP8_TENSOR): the
scale of row n is scale[n] or scale[0]."""

from radiance.abi import (
    RAD_DT_F32, RAD_DT_FP8_E4M3, RAD_E_DTYPE, RAD_E_SHAPE, RAD_E_UNSUPPORTED, RAD_PLANE_TILED,
)

from .rows import FORMAT_CODES, QK, encoding_format

FP8_FORMATS = ("fp8_channel", "fp8")
CODES = {**FORMAT_CODES, "fp8_channel": 5, "fp8": 6}  # common.cu's FMT_*
# bytes a row of K elements takes in the codes plane, by format
CODE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 1, "fp8_channel": 1, "fp8": 1}


def _tiled(plane, dtype, block_rows, block_cols) -> bool:
    return (plane.kind == RAD_PLANE_TILED and plane.dtype == dtype and plane.block_rows == block_rows
            and plane.block_cols == block_cols)


def device_format(encoding) -> str | None:
    """The format name when the device rows read `encoding` as stored, else None. fp8: scheme
    `plain`, e4m3 codes [1x1] and an f32 scale of block [1x0] (a row) or [0x0] (the weight), no
    transform."""
    found = encoding_format(encoding)
    if found is not None or encoding is None or encoding.transform or encoding.vec != 1:
        return found
    planes = {plane.name: plane for plane in encoding.planes}
    if encoding.scheme != "plain" or set(planes) != {"codes", "scale"} or not _tiled(planes["codes"], RAD_DT_FP8_E4M3, 1, 1):
        return None
    if _tiled(planes["scale"], RAD_DT_F32, 1, 0):
        return "fp8_channel"
    if _tiled(planes["scale"], RAD_DT_F32, 0, 0):
        return "fp8"
    return None


def layout_as_stored(formats):
    """A layout hook: the planes as the container holds them (RAD_E_UNSUPPORTED: read in place)
    when the encoding is one of `formats`, RAD_E_DTYPE otherwise; RAD_E_SHAPE for a q4_1/q8_0
    weight whose K is not a multiple of its blocks."""
    def layout(weight, encoding, geometry):
        found = device_format(encoding)
        if found not in formats:
            return RAD_E_DTYPE
        if found in ("q4_1", "q8_0") and int(geometry.get("K", geometry.get("n", QK))) % QK:
            return RAD_E_SHAPE
        return RAD_E_UNSUPPORTED
    return layout
