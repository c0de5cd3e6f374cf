"""Sample encodings and a sample `.rad` file for the container tests (real files, seeded bytes)."""

import json
import struct

import numpy as np

from radiance.abi import (
    RAD_DT_F16, RAD_DT_F32, RAD_DT_I32, RAD_DT_I8, RAD_DT_U4, RAD_PLANE_TABLE, RAD_PLANE_TILED,
    RadEncoding, RadPlane,
)
from radiance.weights.container_writer import ContainerWriter

TOKENIZER = json.dumps({"model": {"vocab": {"héllo": 0, "wörld": 1}}}, ensure_ascii=False)
CHAT_TEMPLATE = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
HYPER = {"hidden": 128, "layers": 2, "heads": 4, "rope_theta": 10000.0}


def tiled(name, dtype, block_cols=1):
    return RadPlane(name=name, dtype=dtype, kind=RAD_PLANE_TILED, block_rows=1, block_cols=block_cols)


def q4_1():
    """Q4_1 as data: u4 codes, f16 scale and f16 minimum per 32 columns."""
    return RadEncoding(scheme="affine", planes=(tiled("codes", RAD_DT_U4), tiled("scale", RAD_DT_F16, 32),
                                                tiled("min", RAD_DT_F16, 32)))


def q8_0_two_scales_perm(cols):
    """i8 codes, two scale levels and an act-order permutation table."""
    return RadEncoding(scheme="affine", transform="perm", planes=(
        tiled("codes", RAD_DT_I8), tiled("scale", RAD_DT_F16, 32), tiled("scale.1", RAD_DT_F32, 0),
        RadPlane(name="t.perm", dtype=RAD_DT_I32, kind=RAD_PLANE_TABLE, rows=1, cols=cols)))


def plain_f32():
    return RadEncoding(scheme="plain", planes=(tiled("codes", RAD_DT_F32),))


def sample_planes(seed=0):
    """{weight: (shape, encoding, {plane: bytes})}: odd sizes, so padding is needed between planes."""
    rng = np.random.default_rng(seed)

    def noise(nbytes):
        return rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()

    return {
        "layers.0.attn.q": ((64, 96), q4_1(), {"codes": noise(64 * 48), "scale": noise(64 * 3 * 2),
                                               "min": noise(64 * 3 * 2)}),
        "layers.0.mlp.down": ((10, 64), q8_0_two_scales_perm(64), {
            "codes": noise(640), "scale": noise(10 * 2 * 2), "scale.1": noise(4), "t.perm": noise(256)}),
        "norm": ((37,), plain_f32(), {"codes": noise(37 * 4)}),
    }


def write_sample(path, chunk=100):
    """Write the sample, every plane streamed in `chunk`-byte pieces, planes interleaved; return it."""
    weights = sample_planes()
    with ContainerWriter(path, "llama", HYPER, tokenizer=TOKENIZER, chat_template=CHAT_TEMPLATE,
                         metadata={"source": "test", "quantiser": "q4_1"}) as writer:
        for name, (shape, encoding, planes) in weights.items():
            writer.declare(name, shape, encoding, {plane: len(data) for plane, data in planes.items()})
        longest = max(len(data) for _, _, planes in weights.values() for data in planes.values())
        for offset in range(0, longest, chunk):
            for name, (_, _, planes) in weights.items():
                for plane, data in planes.items():
                    if offset < len(data):
                        writer.write(name, plane, data[offset:offset + chunk])
    return weights


def read_header(path):
    """(safetensors header dict, radiance dict, data bytes) of a file."""
    blob = open(path, "rb").read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    return header, json.loads(header["__metadata__"]["radiance"]), blob[8 + length:]


def write_header(path, header, radiance, data):
    """Rewrite a file with the given header and data (any header: this is how bad input is made);
    `radiance`, unless None, replaces the header's `__metadata__`."""
    if radiance is not None:
        header = dict(header, __metadata__={"radiance": json.dumps(radiance)})
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 64)  # the data area on 64 bytes, as the format has it
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(text)) + text + data)
