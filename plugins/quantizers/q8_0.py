"""q8_0: w = code * scale, i8 codes and an f16 scale per `group` columns (GGUF Q8_0 at group 32).

The scale is amax / 127 of its group, cast to f16 and nudged up one f16 step where the cast went
below, so no code is ever clipped: |w - decoded| <= scale / 2 (docs/QUANTIZERS.md).
"""

import numpy as np

from radiance.abi import (
    RAD_ABI_VERSION, RAD_DT_F16, RAD_DT_I8, RAD_P_INT, RAD_PLANE_TILED, RAD_PLUGIN_QUANT, RadEncoding,
    RadPlane, RadPluginInfo, RadQuantizerInfo, RadQuantOption,
)

ROW_ELEMENTS = 1 << 20  # f32 elements handed to one quantize() call (4 MiB)
LEVELS = 127


def rad_plugin_abi_version():
    return RAD_ABI_VERSION


def rad_plugin_info():
    return RadPluginInfo(RAD_PLUGIN_QUANT, "q8_0", "0.1", "i8 codes, an f16 scale per group", "")


def encoding(weight, shape, options):
    group = options["group"]
    if group < 1:
        raise ValueError(f"{weight}: group {group} is not a positive column count")
    return RadEncoding(scheme="plain", planes=(
        RadPlane("codes", RAD_DT_I8, RAD_PLANE_TILED, 1, 1),
        RadPlane("scale", RAD_DT_F16, RAD_PLANE_TILED, 1, group)))


def row_block(encoding, shape):
    return max(1, ROW_ELEMENTS // max(1, shape[1]))


def quantize(encoding, rows, r0, options):
    count, cols = rows.shape
    group = encoding.plane("scale").block_cols
    # [rows, groups, group]; the last group padded with its own edge value, which moves no amax
    grouped = np.pad(rows, ((0, 0), (0, -cols % group)), mode="edge").reshape(count, -1, group)
    amax = np.abs(grouped).max(axis=2)
    with np.errstate(over="ignore"):  # an overflow is refused below
        scale = (amax / LEVELS).astype(np.float16)
    scale = np.where(scale.astype(np.float32) * LEVELS < amax, np.nextafter(scale, np.float16(np.inf)), scale)
    if not np.isfinite(scale).all():
        raise ValueError(f"rows from {r0}: a group's amax exceeds what an f16 scale holds")
    inverse = np.divide(1, scale.astype(np.float32), out=np.zeros_like(amax), where=scale > 0)
    codes = np.rint(grouped * inverse[..., None]).reshape(count, -1)[:, :cols].astype(np.int8)
    return {"codes": codes.view(np.uint8), "scale": scale.view(np.uint8)}


QUANTIZERS = [RadQuantizerInfo(
    name="q8_0",
    doc="w = code * scale: i8 codes, an f16 scale per group of columns; |error| <= scale / 2",
    options=[RadQuantOption("group", RAD_P_INT, "32", "columns that share one scale")],
    encoding=encoding, row_block=row_block, quantize=quantize)]


def rad_quant_count():
    return len(QUANTIZERS)


def rad_quant_at(i):
    return QUANTIZERS[i]
