"""A weight's format label (`wdtype` in the op vocabulary): the name of the common encoding it
equals, or `<scheme>` for one a plugin invented."""

from radiance.abi import RadEncoding

from . import formats

KNOWN = {
    "q8_0": formats.q8_0(), "q4_0": formats.q4_0(), "q4_1": formats.q4_1(), "q5_0": formats.q5_0(),
    "q5_1": formats.q5_1(), "q2_k": formats.q2_k(), "q3_k": formats.q3_k(), "q4_k": formats.q4_k(),
    "q5_k": formats.q5_k(), "q6_k": formats.q6_k(), "fp8": formats.fp8(), "nvfp4": formats.nvfp4(),
    **{name: formats.plain(name) for name in ("f32", "f16", "bf16")},
}


def format_label(encoding: RadEncoding) -> str:
    for label, known in KNOWN.items():
        if encoding == known:
            return label
    return encoding.scheme
