"""A weight decoded to f32 without knowing how it was made: the core decoder for the `plain` and
`affine` schemes, else the first quantiser whose decode hook accepts the encoding (each returns
RAD_E_UNSUPPORTED for one it did not write)."""

from radiance.weights.decode import decode
from radiance.weights.levels import CORE_SCHEMES


def decode_weight(encoding, planes: dict, shape: tuple, quantizers: dict, name: str = "weight"):
    if encoding.scheme in CORE_SCHEMES:
        return decode(encoding, planes, shape, name)
    for quantizer in quantizers.values():
        values = quantizer.decode(encoding, planes, shape)
        if values is not None:
            return values
    raise ValueError(f"{name}: scheme {encoding.scheme!r} is decoded by no loaded quantiser "
                     f"(none of {', '.join(quantizers) or 'none'} accepts it)")
