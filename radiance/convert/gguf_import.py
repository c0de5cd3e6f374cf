"""GGUF import, llama family: every tensor becomes the encoding of its block format without
requantising (radiance.weights.gguf_blocks), row block by row block over the memory-mapped file; the
error report compares against gguf's own dequantiser. Hyper-parameters from the llama.* metadata,
the tokenizer rebuilt as tokenizer.json, the chat template carried."""

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

from radiance.weights.gguf_blocks import ENCODINGS, gguf_encoding, split_blocks

from .errors import ConvertError
from .gguf_tokenizer import gguf_tokenizer
from .job import WeightJob
from .names import check_weights, gguf_weight_name
from .pipeline import Model

ARCHITECTURES = ("llama",)
ROW_ELEMENTS = 1 << 20  # weight elements per row block (4 MiB dequantised)
MISSING = object()


def _f32(value) -> float:
    """A float stored as f32, as the shortest decimal that reads back as that f32 (1e-05, not 9.99e-06)."""
    return float(str(np.float32(value)))


def _metadata(reader):
    def value(key, default=MISSING):
        field = reader.fields.get(key)
        if field is None:
            if default is MISSING:
                raise ValueError(f"metadata {key} is missing")
            return default
        return field.contents()
    return value


def _hyper(value, shapes: dict) -> dict:
    hidden, heads = value("llama.embedding_length"), value("llama.attention.head_count")
    if "token_embd" not in shapes:
        raise ValueError("tensor token_embd.weight is missing")
    eos = [value(f"tokenizer.ggml.{key}_token_id", None) for key in ("eos", "eot", "eom")]
    hyper = {"hidden": hidden, "layers": value("llama.block_count"), "heads": heads,
             "kv_heads": value("llama.attention.head_count_kv", heads),
             "head_dim": value("llama.attention.key_length", hidden // heads),
             "ffn": value("llama.feed_forward_length"), "vocab": shapes["token_embd"][0],
             "context": value("llama.context_length"),
             "rope_theta": _f32(value("llama.rope.freq_base", 10000.0)),
             "rms_eps": _f32(value("llama.attention.layer_norm_rms_epsilon")),
             "tie_embeddings": "output" not in shapes, "rope_interleaved": 1,
             "bos_token_id": value("tokenizer.ggml.bos_token_id", None),
             "eos_token_ids": list(dict.fromkeys(token for token in eos if token is not None)),
             "add_bos": bool(value("tokenizer.ggml.add_bos_token", False))}
    scaling = value("llama.rope.scaling.type", "none")
    if scaling != "none":
        hyper["rope_scaling"] = {"rope_type": scaling, "factor": _f32(value("llama.rope.scaling.factor"))}
        original = value("llama.rope.scaling.original_context_length", None)
        if original is not None:
            hyper["rope_scaling"]["original_max_position_embeddings"] = original
    return hyper


def _job(name: str, tensor) -> WeightJob:
    dims = [int(n) for n in reversed(tensor.shape.tolist())]  # GGUF's ne is innermost first
    rows, cols = dims if len(dims) == 2 else (1, dims[0])
    raw = np.asarray(tensor.data).view(np.uint8).reshape(rows, -1)
    qtype = tensor.tensor_type

    def produce(r0, r1):
        block = raw[r0:r1]
        return (split_blocks(block, qtype, (r1 - r0, cols), tensor.name),
                dequantize(block, qtype).reshape(r1 - r0, cols))

    return WeightJob(name, tuple(dims), gguf_encoding(qtype, tensor.name),
                     max(1, ROW_ELEMENTS // cols), f"gguf {qtype.name}", produce)


def _jobs(reader) -> tuple[dict, dict]:
    """({our name: WeightJob}, {our name: the GGUF tensor's name})."""
    jobs, sources = {}, {}
    for tensor in reader.tensors:
        name = gguf_weight_name(tensor.name)
        if name is None:
            raise ValueError(f"tensor {tensor.name!r} is no llama weight that rad-convert knows")
        if tensor.tensor_type not in ENCODINGS:
            supported = ", ".join(qtype.name for qtype in ENCODINGS)
            raise ValueError(f"tensor {tensor.name!r} has GGUF type {tensor.tensor_type.name}, which is "
                             f"not imported (supported: {supported})")
        if len(tensor.shape) > 2:
            raise ValueError(f"tensor {tensor.name!r} has {len(tensor.shape)} dimensions, not 1 or 2")
        jobs[name], sources[name] = _job(name, tensor), tensor.name
    return jobs, sources


def read_gguf(path) -> Model:
    """The model a GGUF file holds, its weights still to be split; ConvertError names what is wrong."""
    try:
        reader = GGUFReader(path)
    except Exception as error:  # the gguf package raises many kinds on a damaged file
        raise ConvertError(path, f"not a readable GGUF file (truncated or damaged): {error}") from None
    value = _metadata(reader)
    architecture = value("general.architecture", None)
    if architecture not in ARCHITECTURES:
        raise ConvertError(path, f"architecture {architecture!r} is not imported (rad-convert imports "
                                 f"the llama family: {', '.join(ARCHITECTURES)})")
    try:
        jobs, sources = _jobs(reader)
        shapes = {name: job.shape for name, job in jobs.items()}
        hyper = _hyper(value, shapes)
        order = check_weights(shapes, hyper, sources)
        tokenizer = gguf_tokenizer(value)
    except ValueError as error:
        raise ConvertError(path, str(error)) from None
    return Model(str(path), architecture, hyper, tokenizer, value("tokenizer.chat_template", None),
                 [jobs[name] for name in order], {"source_format": "gguf"})
