"""q4_1: w = code * scale - min, u4 codes, an f16 scale and an f16 min per `group` columns (GGUF
Q4_1 at group 32). The min plane holds -m of GGUF's w = d * q + m (docs/ENCODINGS.md).

m is the group's minimum cast to f16 and nudged down one f16 step where the cast went above it;
the scale is (max - m) / 15 cast to f16 and nudged up where the cast went below. So every value
lies in [m, m + 15 * scale], no code is clipped, and |w - decoded| <= scale / 2 (docs/QUANTIZERS.md).
"""

import numpy as np

from radiance.abi import (
    RAD_ABI_VERSION, RAD_DT_F16, RAD_DT_U4, RAD_P_INT, RAD_PLANE_TILED, RAD_PLUGIN_QUANT, RadEncoding,
    RadPlane, RadPluginInfo, RadQuantizerInfo, RadQuantOption, pack_bits,
)

ROW_ELEMENTS = 1 << 20  # f32 elements handed to one quantize() call (4 MiB)
LEVELS = 15


def rad_plugin_abi_version():
    return RAD_ABI_VERSION


def rad_plugin_info():
    return RadPluginInfo(RAD_PLUGIN_QUANT, "q4_1", "0.1", "u4 codes, an f16 scale and min per group", "")


def encoding(weight, shape, options):
    group = options["group"]
    if group < 1:
        raise ValueError(f"{weight}: group {group} is not a positive column count")
    return RadEncoding(scheme="affine", planes=(
        RadPlane("codes", RAD_DT_U4, RAD_PLANE_TILED, 1, 1),
        RadPlane("scale", RAD_DT_F16, RAD_PLANE_TILED, 1, group),
        RadPlane("min", RAD_DT_F16, RAD_PLANE_TILED, 1, group)))


def row_block(encoding, shape):
    return max(1, ROW_ELEMENTS // max(1, shape[1]))


def quantize(encoding, rows, r0, options):
    count, cols = rows.shape
    group = encoding.plane("scale").block_cols
    # [rows, groups, group]; the last group padded with its own edge value, which moves no extreme
    grouped = np.pad(rows, ((0, 0), (0, -cols % group)), mode="edge").reshape(count, -1, group)
    low, high = grouped.min(axis=2), grouped.max(axis=2)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below
        minimum = low.astype(np.float16)
        minimum = np.where(minimum.astype(np.float32) > low, np.nextafter(minimum, np.float16(-np.inf)), minimum)
        span = high - minimum.astype(np.float32)
        scale = (span / LEVELS).astype(np.float16)
    scale = np.where(scale.astype(np.float32) * LEVELS < span, np.nextafter(scale, np.float16(np.inf)), scale)
    if not (np.isfinite(scale).all() and np.isfinite(minimum).all()):
        raise ValueError(f"rows from {r0}: a group's range exceeds what an f16 scale and min hold")
    inverse = np.divide(1, scale.astype(np.float32), out=np.zeros_like(span), where=scale > 0)
    codes = np.rint((grouped - minimum[..., None].astype(np.float32)) * inverse[..., None])
    codes = np.clip(codes, 0, LEVELS).reshape(count, -1)[:, :cols].astype(np.uint8)
    return {"codes": pack_bits(codes, 4), "scale": scale.view(np.uint8), "min": (-minimum).view(np.uint8)}


QUANTIZERS = [RadQuantizerInfo(
    name="q4_1",
    doc="w = code * scale - min: u4 codes, an f16 scale and min per group of columns; |error| <= scale / 2",
    options=[RadQuantOption("group", RAD_P_INT, "32", "columns that share one scale and min")],
    encoding=encoding, row_block=row_block, quantize=quantize)]


def rad_quant_count():
    return len(QUANTIZERS)


def rad_quant_at(i):
    return QUANTIZERS[i]
