"""plain: the weight unquantised, cast to f32, f16 or bf16 (rounded to nearest even by numpy and
ml_dtypes). The converter's default for a weight no recipe rule picks: bf16, f32 for a vector.
|w - decoded| <= 2^-8 |w| for bf16, 2^-11 |w| for f16 in its normal range, 0 for f32
(docs/QUANTIZERS.md).
"""

import numpy as np

from radiance.abi import (
    BY_NAME, NUMPY, RAD_ABI_VERSION, RAD_P_STR, RAD_PLANE_TILED, RAD_PLUGIN_QUANT, RadEncoding, RadPlane,
    RadPluginInfo, RadQuantizerInfo, RadQuantOption,
)

ROW_ELEMENTS = 1 << 20  # f32 elements handed to one quantize() call (4 MiB)
DTYPES = ("f32", "f16", "bf16")


def rad_plugin_abi_version():
    return RAD_ABI_VERSION


def rad_plugin_info():
    return RadPluginInfo(RAD_PLUGIN_QUANT, "plain", "0.1", "unquantised f32, f16 or bf16", "")


def encoding(weight, shape, options):
    if options["dtype"] not in DTYPES:
        raise ValueError(f"{weight}: dtype {options['dtype']!r} is not one of {', '.join(DTYPES)}")
    return RadEncoding(scheme="plain", planes=(
        RadPlane("codes", BY_NAME[options["dtype"]], RAD_PLANE_TILED, 1, 1),))


def row_block(encoding, shape):
    return max(1, ROW_ELEMENTS // max(1, shape[1]))


def quantize(encoding, rows, r0, options):
    with np.errstate(over="ignore"):  # an overflow is refused below
        codes = rows.astype(NUMPY[encoding.plane("codes").dtype])
    if not np.isfinite(codes).all() and np.isfinite(rows).all():
        raise ValueError(f"rows from {r0}: a value overflows {options['dtype']}")
    return {"codes": codes.view(np.uint8)}


QUANTIZERS = [RadQuantizerInfo(
    name="plain",
    doc="the weight unquantised, cast to f32, f16 or bf16",
    options=[RadQuantOption("dtype", RAD_P_STR, "bf16", "f32, f16 or bf16")],
    encoding=encoding, row_block=row_block, quantize=quantize)]


def rad_quant_count():
    return len(QUANTIZERS)


def rad_quant_at(i):
    return QUANTIZERS[i]
