"""GGUF import, any family an architecture plugin takes (families.py): every tensor becomes the
encoding of its block format without requantising (radiance.weights.gguf_blocks), row block by row
block over the memory-mapped file; the error report compares against gguf's own dequantiser. The
plugin gives the hyper-parameters and the weights' names and shapes; the tokenizer is rebuilt as
tokenizer.json and the chat template carried."""

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from radiance.abi import RAD_SOURCE_GGUF, RadSourceInfo, RadWeightInfo
from radiance.weights.gguf_blocks import ENCODINGS, gguf_encoding, split_blocks

from .errors import ConvertError
from .families import matched, taking
from .gguf_tokenizer import gguf_tokenizer
from .job import WeightJob
from .pipeline import Model

ROW_ELEMENTS = 1 << 20  # weight elements per row block (4 MiB dequantised)
MISSING = object()
TOKENIZER_PREFIX = "tokenizer."


def _metadata(reader):
    def value(key, default=MISSING):
        field = reader.fields.get(key)
        if field is None:
            if default is MISSING:
                raise ValueError(f"metadata {key} is missing")
            return default
        return field.contents()
    return value


def _matrix(tensor) -> tuple[int, int]:
    """[rows, cols] of a tensor (GGUF's ne is innermost first; a vector is one row)."""
    dims = [int(n) for n in reversed(tensor.shape.tolist())]
    return tuple(dims) if len(dims) == 2 else (1, dims[0])


def _shape(tensor) -> tuple:
    return tuple(int(n) for n in reversed(tensor.shape.tolist()))


def _job(name: str, tensor) -> WeightJob:
    rows, cols = _matrix(tensor)
    raw = np.asarray(tensor.data).view(np.uint8).reshape(rows, -1)
    qtype = tensor.tensor_type

    def produce(r0, r1):
        block = raw[r0:r1]
        return (split_blocks(block, qtype, (r1 - r0, cols), tensor.name),
                dequantize(block, qtype).reshape(r1 - r0, cols))

    return WeightJob(name, _shape(tensor), gguf_encoding(qtype, tensor.name),
                     max(1, ROW_ELEMENTS // cols), f"gguf {qtype.name}", produce)


def _tensors(reader) -> dict:
    """{GGUF name: tensor}, every one of a type that is imported and of 1 or 2 dimensions."""
    tensors = {}
    for tensor in reader.tensors:
        if tensor.tensor_type not in ENCODINGS:
            supported = ", ".join(qtype.name for qtype in ENCODINGS)
            raise ValueError(f"tensor {tensor.name!r} has GGUF type {tensor.tensor_type.name}, which is "
                             f"not imported (supported: {supported})")
        if len(tensor.shape) > 2:
            raise ValueError(f"tensor {tensor.name!r} has {len(tensor.shape)} dimensions, not 1 or 2")
        tensors[tensor.name] = tensor
    return tensors


def _source(family: str, reader, tensors: dict) -> RadSourceInfo:
    meta = {key: field.contents() for key, field in reader.fields.items()
            if not key.startswith(TOKENIZER_PREFIX) and not key.startswith("GGUF.")}
    infos = {name: RadWeightInfo(name=name, rows=_matrix(tensor)[0], cols=_matrix(tensor)[1],
                                 format=tensor.tensor_type.name) for name, tensor in tensors.items()}

    def read_f32(name):
        tensor = tensors[name]
        return dequantize(np.asarray(tensor.data).view(np.uint8), tensor.tensor_type).reshape(-1).astype(np.float32)

    return RadSourceInfo(kind=RAD_SOURCE_GGUF, family=family, meta=meta, tensors=infos, read_f32=read_f32)


# llama.cpp's end-of-generation tokens by their text (llama-vocab.cpp: special_eog_ids), beside the
# eos/eot/eom ids the metadata names: Gemma's <end_of_turn>, ChatML's <|im_end|>, ...
END_OF_GENERATION = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
                     "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>")


def tokenizer_hyper(value) -> dict:
    """The hyper-parameters every family gets from a GGUF file's tokenizer metadata: BOS, whether a
    prompt starts with it, and the tokens that end a generation as llama.cpp's set has them."""
    eos = [value(f"tokenizer.ggml.{key}_token_id", None) for key in ("eos", "eot", "eom")]
    tokens = value("tokenizer.ggml.tokens", [])
    eos += [i for i, token in enumerate(tokens) if token in END_OF_GENERATION]
    return {"bos_token_id": value("tokenizer.ggml.bos_token_id", None),
            "eos_token_ids": list(dict.fromkeys(token for token in eos if token is not None)),
            "add_bos": bool(value("tokenizer.ggml.add_bos_token", False))}


def read_gguf(path, families: list) -> Model:
    """The model a GGUF file holds, its weights still to be split; ConvertError names what is wrong.
    `families`: the architectures with import hooks (plugins.Plugins.families)."""
    try:
        reader = GGUFReader(path)
    except Exception as error:  # the gguf package raises many kinds on a damaged file
        raise ConvertError(path, f"not a readable GGUF file (truncated or damaged): {error}") from None
    value = _metadata(reader)
    try:
        family, taken = taking(families, RAD_SOURCE_GGUF, [str(value("general.architecture", None))])
        tensors = _tensors(reader)
        hyper = family.hyper(_source(taken, reader, tensors))
        tokenizer = gguf_tokenizer(value)
        hyper.update(tokenizer_hyper(value))
        kept = matched(family.weights(hyper), {name: _shape(tensor) for name, tensor in tensors.items()},
                       "gguf", family.name)
    except ValueError as error:
        raise ConvertError(path, str(error)) from None
    return Model(str(path), family.name, hyper, tokenizer, value("tokenizer.chat_template", None),
                 [_job(spec.name, tensors[tensor]) for spec, tensor in kept], {"source_format": "gguf"})
