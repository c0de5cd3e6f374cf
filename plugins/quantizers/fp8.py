"""fp8: w = code * scale, fp8 e4m3 (OCP, max 448) codes and f32 scales: one for the whole weight
(option scale = "tensor", the default) or one per row, that is per output channel ("channel").

A scale is the amax of what it covers / 448 (1 where that is all zeros). Per tensor, row_block() asks
for the whole weight in one call: memory for such a weight is bounded by that weight (f32), not by
a row block; per channel each row stands alone and the weight streams in row blocks. Codes are
w / scale clipped to +-448 and rounded to nearest even by ml_dtypes' cast:
|w - decoded| <= max(2^-4 |w|, 2^-10 scale) (docs/QUANTIZERS.md).
"""

import numpy as np

from radiance.abi import (
    NUMPY, RAD_ABI_VERSION, RAD_DT_F32, RAD_DT_FP8_E4M3, RAD_P_STR, RAD_PLANE_TILED, RAD_PLUGIN_QUANT, RadEncoding, RadPlane,
    RadPluginInfo, RadQuantizerInfo, RadQuantOption,
)

CODE_MAX = 448.0  # e4m3fn's largest finite value (OCP fp8); ml_dtypes is imported only to cast
SCALES = ("tensor", "channel")
ROW_ELEMENTS = 1 << 20  # per channel: f32 elements handed to one quantize() call (4 MiB)


def rad_plugin_abi_version():
    return RAD_ABI_VERSION


def rad_plugin_info():
    return RadPluginInfo(RAD_PLUGIN_QUANT, "fp8", "0.2", "fp8 e4m3 codes, an f32 scale per tensor or per output channel", "")


def _scale(options) -> str:
    scale = options.get("scale", "tensor")
    if scale not in SCALES:
        raise ValueError(f"scale {scale!r} is not one of {', '.join(SCALES)}")
    return scale


def encoding(weight, shape, options):
    # a scale per row is a TILED plane of block [1 x 0]: one element a row, covering the whole row
    block = (1, 0) if _scale(options) == "channel" else (0, 0)
    return RadEncoding(scheme="plain", planes=(
        RadPlane("codes", RAD_DT_FP8_E4M3, RAD_PLANE_TILED, 1, 1),
        RadPlane("scale", RAD_DT_F32, RAD_PLANE_TILED, *block)))


def row_block(encoding, shape):
    if encoding.plane("scale").block_rows == 0:
        return 0  # the per-tensor scale needs the whole weight's amax
    return max(1, ROW_ELEMENTS // max(1, shape[1]))


def quantize(encoding, rows, r0, options):
    if not np.isfinite(rows).all():
        raise ValueError(f"rows from {r0}: the weight holds a non-finite value")
    per_row = encoding.plane("scale").block_rows == 1
    amax = np.abs(rows).max(axis=1, keepdims=True, initial=0.0) if per_row else np.abs(rows).max(keepdims=True, initial=0.0)
    scale = np.where(amax > 0, amax / np.float32(CODE_MAX), 1.0).astype(np.float32)
    # Clipped first: ml_dtypes turns anything past 448 into NaN (e4m3fn has no infinity).
    codes = np.clip(rows / scale, -CODE_MAX, CODE_MAX).astype(NUMPY[RAD_DT_FP8_E4M3])
    return {"codes": codes.view(np.uint8), "scale": scale.reshape(-1, 1).view(np.uint8)}


QUANTIZERS = [RadQuantizerInfo(
    name="fp8",
    doc="w = code * scale: fp8 e4m3 codes, f32 scales (amax / 448) for the whole weight or per output channel",
    options=[RadQuantOption("scale", RAD_P_STR, "tensor", "tensor: one scale for the weight; channel: one per row")],
    encoding=encoding, row_block=row_block, quantize=quantize)]


def rad_quant_count():
    return len(QUANTIZERS)


def rad_quant_at(i):
    return QUANTIZERS[i]
