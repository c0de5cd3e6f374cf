"""Writing and reading real `.rad` files: round trips, safetensors compatibility, the writer's refusals."""

import os

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from radiance.abi import RAD_DT_U8, RAD_PLANE_TILED, RadEncoding, RadPlane
from radiance.weights.container_format import ALIGN, ContainerError
from radiance.weights.container_reader import Container
from radiance.weights.container_writer import ContainerWriter

from container_samples import CHAT_TEMPLATE, HYPER, TOKENIZER, plain_f32, q4_1, tiled, write_sample


@pytest.mark.parametrize("chunk", [1, 7, 100, 1 << 20])
def test_round_trip_of_streamed_interleaved_planes(tmp_path, chunk):
    path = tmp_path / "model.rad"
    weights = write_sample(path, chunk)
    assert sorted(os.listdir(tmp_path)) == ["model.rad"]
    with Container(path) as container:
        assert container.architecture == "llama" and container.hyper == HYPER
        assert container.tokenizer == TOKENIZER and container.chat_template == CHAT_TEMPLATE
        assert container.metadata == {"source": "test", "quantiser": "q4_1"}
        assert container.weights == tuple(weights)
        for name, (shape, encoding, planes) in weights.items():
            assert container.shape(name) == shape and container.encoding(name) == encoding
            assert container.planes(name) == tuple(planes)
            for plane, data in planes.items():
                view = container.plane(name, plane)
                assert view.dtype == np.uint8 and view.tobytes() == data
                assert container.plane_nbytes(name, plane) == len(data)
                assert view.ctypes.data % ALIGN == 0 and not view.flags.writeable
        assert container.verify() == []


def test_plane_range_is_a_zero_copy_slice(tmp_path):
    weights = write_sample(tmp_path / "model.rad")
    data = weights["layers.0.attn.q"][2]["codes"]
    with Container(tmp_path / "model.rad") as container:
        whole = container.plane("layers.0.attn.q", "codes")
        part = container.plane_range("layers.0.attn.q", "codes", 48 * 10, 48 * 20)
        assert part.tobytes() == data[480:960] and np.shares_memory(part, whole)
        assert container.plane_range("layers.0.attn.q", "codes", 5, 5).size == 0
        for start, stop in ((-1, 4), (10, 5), (0, len(data) + 1)):
            with pytest.raises(ContainerError, match=r"model\.rad: layers\.0\.attn\.q\.codes bytes"):
                container.plane_range("layers.0.attn.q", "codes", start, stop)
        with pytest.raises(KeyError, match="no plane 'zero'"):
            container.plane("layers.0.attn.q", "zero")
        with pytest.raises(KeyError, match="no weight 'missing'"):
            container.shape("missing")
    # A view outlives the container: the mapping stays until the view goes.
    assert part.tobytes() == data[480:960]
    with pytest.raises(ContainerError, match="closed"):
        container.plane("layers.0.attn.q", "codes")


def test_safetensors_reads_every_plane_and_the_padding(tmp_path):
    path = str(tmp_path / "model.rad")
    weights = write_sample(path)
    tensors = load_file(path)
    expected = {f"{name}.{plane}": data for name, (_, _, planes) in weights.items() for plane, data in planes.items()}
    pads = {name: array for name, array in tensors.items() if name.startswith("__pad__.")}
    assert pads and all(not array.any() for array in pads.values())
    assert {name: array.tobytes() for name, array in tensors.items() if name not in pads} == expected
    with safe_open(path, "np") as file:
        assert set(file.metadata()) == {"radiance"}
        assert file.get_tensor("layers.0.mlp.down.t.perm").tobytes() == expected["layers.0.mlp.down.t.perm"]


def test_arrays_are_written_as_their_raw_bytes(tmp_path):
    values = np.arange(32, dtype=np.float32).reshape(4, 8)
    with ContainerWriter(tmp_path / "a.rad", "llama", {}) as writer:
        writer.declare("w", (4, 8), plain_f32(), {"codes": 128})
        writer.declare("v", (12,), plain_f32(), {"codes": 48})
        writer.write("w", "codes", values[:, :4].T)  # not contiguous: written in its logical order
        writer.write("w", "codes", memoryview(values[:, 4:].copy()))
        writer.write("v", "codes", values[0].astype(ml_dtypes.bfloat16))
        writer.write("v", "codes", bytearray(32))
    with Container(tmp_path / "a.rad") as container:
        codes = container.plane("w", "codes").view(np.float32)
        assert (codes[:16] == values[:, :4].T.reshape(-1)).all() and (codes[16:] == values[:, 4:].reshape(-1)).all()
        bf16 = container.plane("v", "codes")[:16].view(ml_dtypes.bfloat16)
        assert not container.plane("v", "codes")[16:].any()
        assert (bf16.astype(np.float32) == values[0]).all() and container.tokenizer is None


def test_an_incomplete_plane_is_refused_and_leaves_no_file(tmp_path):
    writer = ContainerWriter(tmp_path / "a.rad", "llama", {})
    writer.declare("w", (1, 64), q4_1(), {"codes": 32, "scale": 4, "min": 4})
    writer.write("w", "codes", bytes(32))
    writer.write("w", "scale", bytes(3))
    with pytest.raises(ContainerError, match=r"a\.rad: incomplete, not written: w\.scale lacks 1 bytes "
                                             r"\(and 1 more planes\)"):
        writer.close()
    assert os.listdir(tmp_path) == []


def test_an_exception_inside_the_block_removes_the_partial_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "a.rad"
    write_sample(path)
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="quantiser failed"):
        with ContainerWriter(path, "llama", {}) as writer:
            writer.declare("w", (2,), plain_f32(), {"codes": 8})
            writer.write("w", "codes", bytes(4))
            assert (tmp_path / "a.rad.partial").exists()
            raise RuntimeError("quantiser failed")
    assert os.listdir(tmp_path) == ["a.rad"] and path.read_bytes() == before


def test_writer_refusals_name_the_file_weight_and_plane(tmp_path):
    with ContainerWriter(tmp_path / "a.rad", "llama", {}) as writer:
        with pytest.raises(ContainerError, match=r"'w': plane sizes given for \['codes'\], the encoding has"):
            writer.declare("w", (1, 64), q4_1(), {"codes": 32})
        with pytest.raises(ContainerError, match=r"shape \(1, 2, 3\) is not"):
            writer.declare("w", (1, 2, 3), plain_f32(), {"codes": 24})
        with pytest.raises(ContainerError, match=r"shape \(2, -1\) is not"):
            writer.declare("w", (2, -1), plain_f32(), {"codes": 24})
        with pytest.raises(ContainerError, match="plane 'codes' size True is not a byte count"):
            writer.declare("w", (2,), plain_f32(), {"codes": True})
        with pytest.raises(ContainerError, match="not starting with '__'"):
            writer.declare("__pad__", (2,), plain_f32(), {"codes": 8})
        with pytest.raises(ContainerError, match="'bad': encoding: plane 'codes': dtype 0 has no name"):
            writer.declare("bad", (1,), RadEncoding(planes=(RadPlane(name="codes", kind=RAD_PLANE_TILED),)),
                           {"codes": 1})
        writer.declare("a", (1,), RadEncoding(planes=(tiled("b.codes", RAD_DT_U8),)), {"b.codes": 1})
        with pytest.raises(ContainerError, match=r"tensor name 'a\.b\.codes' is already taken"):
            writer.declare("a.b", (2,), plain_f32(), {"codes": 8})
        writer.declare("w", (np.int64(2),), plain_f32(), {"codes": np.int32(8)})
        with pytest.raises(ContainerError, match="declared twice"):
            writer.declare("w", (2,), plain_f32(), {"codes": 8})
        writer.write("a", "b.codes", b"\x01")
        with pytest.raises(ContainerError, match="declared after the first write"):
            writer.declare("x", (2,), plain_f32(), {"codes": 8})
        with pytest.raises(ContainerError, match="no declared plane 'scale' of weight 'w'"):
            writer.write("w", "scale", b"")
        writer.write("w", "codes", bytes(6))
        with pytest.raises(ContainerError, match="'w' plane 'codes': 3 more bytes overrun its declared size by 1"):
            writer.write("w", "codes", bytes(3))
        writer.write("w", "codes", bytes(2))
    with pytest.raises(ContainerError, match="hyper is not JSON-serialisable"):
        ContainerWriter(tmp_path / "b.rad", "llama", {"x": object()})
    with Container(tmp_path / "a.rad") as container:
        assert container.weights == ("a", "w") and container.verify() == []
        assert container.shape("w") == (2,) and container.plane("w", "codes").size == 8
