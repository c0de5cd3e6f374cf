"""nvfp4: w = code * scale * scale.1, fp4 e2m1 codes, an fp8 e4m3 scale per 16 columns and one f32
scale.1 for the whole weight (NVIDIA's NVFP4).

scale.1 is amax / (448 * 6) over the whole weight, so the largest block's scale is 448; row_block()
therefore asks for the whole weight in one call (memory for an nvfp4 weight is bounded by that
weight, in f32). Each block's scale is its amax / 6 / scale.1 cast to e4m3; codes are
w / (scale * scale.1) clipped to +-6 and cast to e2m1, both rounded to nearest even by ml_dtypes:
|w - decoded| <= max(scale * scale.1, 6 * 2^-10 * scale.1) (docs/QUANTIZERS.md).
"""

import numpy as np

from radiance.abi import (
    NUMPY, RAD_ABI_VERSION, RAD_DT_F32, RAD_DT_FP4_E2M1, RAD_DT_FP8_E4M3, RAD_PLANE_TILED, RAD_PLUGIN_QUANT,
    UNPACKED, RadEncoding, RadPlane, RadPluginInfo, RadQuantizerInfo, pack_bits,
)

BLOCK = 16
# the largest finite e2m1 and e4m3fn values (OCP): ml_dtypes is imported only to cast
CODE_MAX = 6.0
SCALE_MAX = 448.0


def rad_plugin_abi_version():
    return RAD_ABI_VERSION


def rad_plugin_info():
    return RadPluginInfo(RAD_PLUGIN_QUANT, "nvfp4", "0.1", "fp4 e2m1 codes, e4m3 scale per 16, f32 per tensor", "")


def encoding(weight, shape, options):
    return RadEncoding(scheme="plain", planes=(
        RadPlane("codes", RAD_DT_FP4_E2M1, RAD_PLANE_TILED, 1, 1),
        RadPlane("scale", RAD_DT_FP8_E4M3, RAD_PLANE_TILED, 1, BLOCK),
        RadPlane("scale.1", RAD_DT_F32, RAD_PLANE_TILED, 0, 0)))


def row_block(encoding, shape):
    return 0  # scale.1 needs the whole weight's amax


def quantize(encoding, rows, r0, options):
    count, cols = rows.shape
    amax = float(np.abs(rows).max(initial=0.0))
    if not np.isfinite(amax):
        raise ValueError(f"rows from {r0}: the weight holds a non-finite value")
    tensor_scale = np.float32(amax / (SCALE_MAX * CODE_MAX) if amax else 1.0)
    # [rows, blocks, 16]; the last block padded with its own edge value, which moves no amax
    blocks = np.pad(rows, ((0, 0), (0, -cols % BLOCK)), mode="edge").reshape(count, -1, BLOCK)
    wanted = np.abs(blocks).max(axis=2) / CODE_MAX / tensor_scale
    scale = np.minimum(wanted, SCALE_MAX).astype(NUMPY[RAD_DT_FP8_E4M3])
    step = scale.astype(np.float32) * tensor_scale
    scaled = np.divide(blocks, step[..., None], out=np.zeros_like(blocks), where=step[..., None] > 0)
    codes = np.clip(scaled, -CODE_MAX, CODE_MAX).astype(UNPACKED[RAD_DT_FP4_E2M1])
    codes = codes.reshape(count, -1)[:, :cols].view(np.uint8) & np.uint8(15)
    return {"codes": pack_bits(codes, 4), "scale": scale.view(np.uint8),
            "scale.1": np.full((1, 1), tensor_scale, np.float32).view(np.uint8)}


QUANTIZERS = [RadQuantizerInfo(
    name="nvfp4",
    doc="w = code * scale * scale.1: fp4 e2m1 codes, an e4m3 scale per 16 columns, one f32 scale.1",
    encoding=encoding, row_block=row_block, quantize=quantize)]


def rad_quant_count():
    return len(QUANTIZERS)


def rad_quant_at(i):
    return QUANTIZERS[i]
