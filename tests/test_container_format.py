"""The container's header pieces: encoding <-> JSON, checksum text, layout and header padding."""

import json
import struct

import pytest

from radiance.abi import NAMES, RAD_MAX_PLANES, RadEncoding, RadPlane
from radiance.weights.container_format import (
    ALIGN, PAD_PREFIX, ContainerError, checksum_text, encode_header, encoding_from_json,
    encoding_to_json, parse_checksum, plan_layout,
)

from container_samples import plain_f32, q4_1, q8_0_two_scales_perm, tiled


def test_every_dtype_and_kind_round_trips_through_json():
    planes = tuple(tiled(f"p{dtype}", dtype, 16) for dtype in NAMES)[:RAD_MAX_PLANES - 1]
    for encoding in (q4_1(), q8_0_two_scales_perm(4096), plain_f32(),
                     RadEncoding(scheme="mine", transform="fwht32", vec=8, planes=planes)):
        as_json = encoding_to_json(encoding)
        assert json.loads(json.dumps(as_json)) == as_json
        assert encoding_from_json(as_json) == encoding


def test_json_names_dtypes_and_kinds():
    as_json = encoding_to_json(q8_0_two_scales_perm(64))
    assert [(p["name"], p["dtype"], p["kind"]) for p in as_json["planes"]] == [
        ("codes", "i8", "tiled"), ("scale", "f16", "tiled"), ("scale.1", "f32", "tiled"), ("t.perm", "i32", "table")]
    assert as_json["planes"][3]["cols"] == 64 and as_json["transform"] == "perm"


def _broken(change):
    as_json = encoding_to_json(q4_1())
    change(as_json)
    return as_json


@pytest.mark.parametrize("change, message", [
    (lambda e: e["planes"][0].update(dtype="u7"), "plane 'codes': unknown dtype 'u7'"),
    (lambda e: e["planes"][1].update(kind="dense"), "plane 'scale': unknown kind 'dense'"),
    (lambda e: e["planes"][2].pop("block_cols"), "plane 2: missing field 'block_cols'"),
    (lambda e: e["planes"][0].update(extra=1), "plane 0: unknown field 'extra'"),
    (lambda e: e["planes"][0].update(block_rows=-1), "block_rows -1 is not a non-negative integer"),
    (lambda e: e["planes"][0].update(rows=True), "rows True is not a non-negative integer"),
    (lambda e: e["planes"][0].update(name=""), "name '' is not a non-empty string"),
    (lambda e: e["planes"][1].update(name="codes"), "plane names repeat"),
    (lambda e: e.update(vec=0), "vec 0 is not a positive integer"),
    (lambda e: e.update(scheme=3), "scheme 3 is not a string"),
    (lambda e: e.pop("transform"), "missing field 'transform'"),
    (lambda e: e.update(planes=e["planes"] * 6), "at most 16 planes"),
])
def test_bad_encoding_json_is_a_clear_error(change, message):
    with pytest.raises(ContainerError, match=message.replace(".", r"\.")):
        encoding_from_json(_broken(change))


def test_encoding_with_unnamed_dtype_or_kind_does_not_serialise():
    with pytest.raises(ContainerError, match="dtype 99 has no name"):
        encoding_to_json(RadEncoding(planes=(RadPlane(name="codes", dtype=99, kind=1),)))
    with pytest.raises(ContainerError, match="kind 7 is neither"):
        encoding_to_json(RadEncoding(planes=(RadPlane(name="codes", dtype=1, kind=7),)))


def test_checksum_text_is_fixed_width_and_parses_back():
    assert checksum_text(0) == "crc32:00000000"
    assert parse_checksum(checksum_text(0xDEADBEEF)) == 0xDEADBEEF
    for bad in ("crc32:DEADBEEF", "crc32:123", "sha256:00000000", None):
        with pytest.raises(ContainerError, match="is not 'crc32:'"):
            parse_checksum(bad)


def test_layout_aligns_every_plane_and_pads_fill_every_gap():
    tensors, size = plan_layout([("a", {"codes": 100, "scale": 6}), ("b", {"codes": 64, "t.perm": 0}),
                                 ("c", {"codes": 1})])
    assert list(tensors) == ["a.codes", "__pad__.0", "a.scale", "__pad__.1", "b.codes", "b.t.perm", "c.codes"]
    spans = list(tensors.values())
    assert spans[0][0] == 0 and size == spans[-1][1] == 257
    assert all(stop == start for (_, stop), (start, _) in zip(spans, spans[1:]))  # contiguous
    for name, (start, _) in tensors.items():
        assert name.startswith(PAD_PREFIX) or start % ALIGN == 0


def test_header_puts_the_data_on_the_alignment_and_can_be_rewritten_at_its_length():
    tensors, _ = plan_layout([("w", {"codes": 10})])
    header = encode_header(tensors, {"format_version": 1, "weights": {}})
    assert len(header) % ALIGN == 0
    (length,) = struct.unpack("<Q", header[:8])
    assert length == len(header) - 8 and header.endswith(b" ")
    assert len(encode_header(tensors, {"format_version": 1, "weights": {"x": 1}}, length)) == len(header)
    with pytest.raises(ContainerError, match="exceeds its reserved"):
        encode_header(tensors, {"format_version": 1, "weights": {"x" * 200: 1}}, length)
