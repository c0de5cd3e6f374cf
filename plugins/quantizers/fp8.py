"""fp8: w = code * scale, fp8 e4m3 (OCP, max 448) codes and one f32 scale for the whole weight.

The scale is amax / 448 over the whole weight, so row_block() asks for the whole weight in one call:
memory for an fp8 weight is bounded by that weight (f32), not by a row block. Codes are w / scale
rounded to nearest even by ml_dtypes' cast: |w - decoded| <= max(2^-4 |w|, 2^-10 scale)
(docs/QUANTIZERS.md).
"""

import ml_dtypes
import numpy as np

from radiance.abi import (
    RAD_ABI_VERSION, RAD_DT_F32, RAD_DT_FP8_E4M3, RAD_PLANE_TILED, RAD_PLUGIN_QUANT, RadEncoding, RadPlane,
    RadPluginInfo, RadQuantizerInfo,
)

CODE_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448


def rad_plugin_abi_version():
    return RAD_ABI_VERSION


def rad_plugin_info():
    return RadPluginInfo(RAD_PLUGIN_QUANT, "fp8", "0.1", "fp8 e4m3 codes, an f32 scale per tensor", "")


def encoding(weight, shape, options):
    return RadEncoding(scheme="plain", planes=(
        RadPlane("codes", RAD_DT_FP8_E4M3, RAD_PLANE_TILED, 1, 1),
        RadPlane("scale", RAD_DT_F32, RAD_PLANE_TILED, 0, 0)))


def row_block(encoding, shape):
    return 0  # the per-tensor scale needs the whole weight's amax


def quantize(encoding, rows, r0, options):
    amax = float(np.abs(rows).max(initial=0.0))
    if not np.isfinite(amax):
        raise ValueError(f"rows from {r0}: the weight holds a non-finite value")
    scale = np.float32(amax / CODE_MAX if amax else 1.0)
    # Clipped first: ml_dtypes turns anything past 448 into NaN (e4m3fn has no infinity).
    codes = np.clip(rows / scale, -CODE_MAX, CODE_MAX).astype(ml_dtypes.float8_e4m3fn)
    return {"codes": codes.view(np.uint8), "scale": np.full((1, 1), scale, np.float32).view(np.uint8)}


QUANTIZERS = [RadQuantizerInfo(
    name="fp8",
    doc="w = code * scale: fp8 e4m3 codes, one f32 scale (amax / 448) for the whole weight",
    encoding=encoding, row_block=row_block, quantize=quantize)]


def rad_quant_count():
    return len(QUANTIZERS)


def rad_quant_at(i):
    return QUANTIZERS[i]
