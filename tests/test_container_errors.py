"""Bad `.rad` files: each is a ContainerError of one line naming the file and what is wrong."""

import json
import os

import pytest

from radiance.weights.container_format import ContainerError
from radiance.weights.container_reader import Container

from container_samples import read_header, write_header, write_sample


@pytest.fixture
def sample(tmp_path):
    path = tmp_path / "model.rad"
    write_sample(path)
    return path


def refused(path, message):
    with pytest.raises(ContainerError) as caught:
        Container(path)
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and "\n" not in text
    assert message in text, text
    return text


def test_a_file_cut_anywhere_is_truncated(sample):
    blob = sample.read_bytes()
    header_end = 8 + int.from_bytes(blob[:8], "little")
    for cut, message in ((0, "truncated: 0 bytes"), (5, "truncated: 5 bytes"), (8, "truncated: the header claims"),
                         (header_end // 2, "truncated: the header claims"),
                         (header_end, "run past the end of the data (0 bytes): truncated"),
                         (header_end + 1000, "run past the end of the data (1000 bytes): truncated"),
                         (len(blob) - 1, "run past the end of the data")):
        sample.write_bytes(blob[:cut])
        refused(sample, message)


def rewritten(path, change):
    """The file with its header changed by `change(header, radiance)`, the data kept."""
    header, radiance, data = read_header(path)
    change(header, radiance)
    write_header(path, header, radiance, data)
    return path


def test_overlapping_offsets(sample):
    def overlap(header, _):
        start, stop = header["layers.0.attn.q.scale"]["data_offsets"]
        header["layers.0.attn.q.scale"].update(data_offsets=[start - 64, stop - 64])
    refused(rewritten(sample, overlap), "tensors 'layers.0.attn.q.codes' and 'layers.0.attn.q.scale' overlap")


def test_offsets_running_past_the_end(sample):
    def grow(header, _):
        start, stop = header["norm.codes"]["data_offsets"]
        header["norm.codes"].update(data_offsets=[start, stop + 4], shape=[stop + 4 - start])
    refused(rewritten(sample, grow), "tensor 'norm.codes': data_offsets")


@pytest.mark.parametrize("version, message", [
    (2, "format_version 2 is not supported (this reader reads version 1)"),
    ("1", "format_version '1' is not supported"),
    (True, "format_version True is not supported"),
    (None, "format_version missing (this reader reads version 1)"),
])
def test_unknown_format_version(sample, version, message):
    def set_version(_, radiance):
        radiance.pop("format_version")
        if version is not None:
            radiance["format_version"] = version
    refused(rewritten(sample, set_version), message)


def test_bad_json(sample):
    blob = bytearray(sample.read_bytes())
    blob[8:20] = b'{"broken": ['
    sample.write_bytes(bytes(blob))
    refused(sample, "header is not valid JSON")
    write_header(sample, {"__metadata__": {"radiance": "[1]"}}, None, b"")
    refused(sample, "__metadata__.radiance is not a JSON object")
    write_header(sample, {"__metadata__": {"format": "pt"}}, None, b"")
    refused(sample, "not a radiance container: no __metadata__.radiance string")


@pytest.mark.parametrize("change, message", [
    (lambda h, r: r.pop("architecture"), "radiance.architecture is missing or of the wrong type"),
    (lambda h, r: r.update(hyper=[]), "radiance.hyper is missing or of the wrong type"),
    (lambda h, r: h["norm.codes"].update(dtype="F32"), "tensor 'norm.codes': dtype is not U8"),
    (lambda h, r: h["norm.codes"].update(shape=[1]), "tensor 'norm.codes': shape [1] does not match"),
    (lambda h, r: h["norm.codes"].update(data_offsets=[9, 2]), "data_offsets [9, 2] is not [start, stop]"),
    (lambda h, r: h.pop("norm.codes"), "weight 'norm': plane 'codes' has no tensor 'norm.codes'"),
    (lambda h, r: h.update(stray={"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}),
     "tensor 'stray' belongs to no declared weight plane"),
    (lambda h, r: r["weights"]["norm"]["planes"]["codes"].update(nbytes=4),
     "weight 'norm': plane 'codes' declares 4 bytes, its tensor holds 148"),
    (lambda h, r: r["weights"]["norm"]["planes"]["codes"].update(checksum="md5:0"),
     "weight 'norm': plane 'codes': checksum 'md5:0' is not"),
    (lambda h, r: r["weights"]["norm"]["planes"].pop("codes"), "weight 'norm': planes [] differ from the encoding's"),
    (lambda h, r: r["weights"]["norm"].update(shape=[1, 2, 3]), "weight 'norm': shape [1, 2, 3] is not"),
    (lambda h, r: r["weights"]["norm"]["encoding"]["planes"][0].update(dtype="f12"),
     "weight 'norm': encoding: plane 'codes': unknown dtype 'f12'"),
    (lambda h, r: r["weights"]["norm"]["encoding"]["planes"][0].update(kind="sparse"),
     "weight 'norm': encoding: plane 'codes': unknown kind 'sparse'"),
])
def test_inconsistent_headers(sample, change, message):
    refused(rewritten(sample, change), message)


def test_a_plane_sharing_another_weights_tensor(sample):
    def alias(_, radiance):
        radiance["weights"]["norm.codes"] = radiance["weights"]["norm"]
        radiance["weights"]["norm"] = dict(radiance["weights"]["norm"], planes={})
    path = rewritten(sample, alias)
    refused(path, "weight 'norm': planes [] differ")
    header, radiance, data = read_header(path)
    plane = {"name": "codes", "dtype": "f32", "kind": "tiled", "block_rows": 1, "block_cols": 1, "rows": 0, "cols": 0}
    radiance["weights"] = {"a": {"shape": [1], "encoding": {"scheme": "plain", "transform": "", "vec": 1,
                                                            "planes": [dict(plane, name="b.c")]},
                                 "planes": {"b.c": {"nbytes": 0, "checksum": "crc32:00000000"}}},
                           "a.b": {"shape": [1], "encoding": {"scheme": "plain", "transform": "", "vec": 1,
                                                              "planes": [dict(plane, name="c")]},
                                   "planes": {"c": {"nbytes": 0, "checksum": "crc32:00000000"}}}}
    header = {"a.b.c": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}
    write_header(path, header, radiance, b"")
    refused(path, "weight 'a.b': plane 'c': tensor 'a.b.c' is another weight's plane too")


def test_a_flipped_byte_opens_but_fails_verify(sample):
    header, _, data = read_header(sample)
    start = os.path.getsize(sample) - len(data) + header["layers.0.mlp.down.scale.1"]["data_offsets"][0]
    blob = bytearray(sample.read_bytes())
    blob[start + 2] ^= 0x10
    sample.write_bytes(bytes(blob))
    with Container(sample) as container:
        assert container.verify() == [("layers.0.mlp.down", "scale.1")]
        assert container.plane("layers.0.mlp.down", "codes").size == 640


def test_unreadable_radiance_json(sample):
    header, _, data = read_header(sample)
    header["__metadata__"] = {"radiance": "{not json"}
    text = json.dumps(header).encode()
    sample.write_bytes(len(text).to_bytes(8, "little") + text + data)
    refused(sample, "__metadata__.radiance is not valid JSON")


def with_header_length(path, change, padding=0):
    """The file with `padding` spaces more in its header (the room a converter's report leaves), then
    the 8-byte header length changed by `change`, every other byte kept."""
    header, radiance, data = read_header(path)
    write_header(path, header, None, b"")
    text = path.read_bytes()[8:]
    text += b" " * padding
    path.write_bytes((len(text) + change).to_bytes(8, "little") + text + data)
    return path


@pytest.mark.parametrize("change, message", [
    (-1000, "the data area starts at byte"),  # the header still parses: its padding takes the cut
    (-1024, "the tensors end at byte"),  # on 64 bytes, so only the end of the tensors tells
])
def test_a_damaged_header_length_is_refused(sample, change, message):
    assert "the header length (the first 8 bytes)" in refused(with_header_length(sample, change, padding=2048), message)


def test_a_gap_between_tensors_is_refused(sample):
    def gap(header, _):
        for entry in header.values():
            if isinstance(entry, dict) and "data_offsets" in entry and entry["data_offsets"][0] >= 128:
                entry["data_offsets"] = [offset + 64 for offset in entry["data_offsets"]]
    path = rewritten(sample, gap)
    with open(path, "ab") as file:
        file.write(bytes(64))
    refused(path, "a gap the format does not have")


def test_bytes_after_the_last_tensor_are_refused(sample):
    with open(sample, "ab") as file:
        file.write(bytes(64))
    refused(sample, "the tensors end at byte")


def test_a_plane_off_its_alignment_is_refused(sample):
    def shift(header, _):
        """The pad before a plane 8 bytes shorter, the plane 8 bytes earlier, a new pad after it."""
        pad = next(name for name in header if name.startswith("__pad__."))
        start, stop = header[pad]["data_offsets"]
        plane = next(name for name, entry in header.items()
                     if name != "__metadata__" and entry["data_offsets"][0] == stop)
        header[pad].update(data_offsets=[start, stop - 8], shape=[stop - 8 - start])
        first, last = header[plane]["data_offsets"]
        header[plane]["data_offsets"] = [first - 8, last - 8]
        header["__pad__.moved"] = {"dtype": "U8", "shape": [8], "data_offsets": [last - 8, last]}
        return plane
    path = rewritten(sample, shift)
    refused(path, "not on a multiple of 64")


def test_a_gguf_file_is_named_as_one(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(64))
    text = refused(path, "a GGUF file, not a .rad container")
    assert f"rad-convert {path} -o MODEL.rad" in text
