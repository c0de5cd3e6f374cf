"""Hugging Face folder import, any family an architecture plugin takes (families.py): config.json
(its `architectures`), *.safetensors shards read tensor by tensor and slice by slice (memory
bounded by a row block), tokenizer.json and the chat template (tokenizer_config.json or
chat_template.jinja). The plugin gives the hyper-parameters and the weights' names and shapes (and
an offset some families add to a tensor, Gemma's norms); every weight is quantised as the recipe
says."""

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from radiance.abi import RAD_SOURCE_HF, RadSourceInfo, RadWeightInfo

from .errors import ConvertError
from .families import matched, taking
from .pipeline import Model

FLOAT_DTYPES = ("F32", "F16", "BF16")


def _safetensors(folder):
    """(SafetensorError, safe_open), imported only for a Hugging Face folder (`radiance` imports this
    package for GGUF files, which need none of it)."""
    try:
        from safetensors import SafetensorError, safe_open
    except ImportError:
        raise ConvertError(folder, "reading a Hugging Face folder needs the safetensors package "
                                   "(pip install safetensors)") from None
    return SafetensorError, safe_open


def _json(path: Path, required=True):
    if not path.is_file():
        if required:
            raise ConvertError(path, "is missing")
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ConvertError(path, f"is not readable JSON: {error}") from None
    if not isinstance(value, dict):
        raise ConvertError(path, "is not a JSON object")
    return value


def tokenizer_hyper(config: dict, tokenizer: Tokenizer) -> dict:
    """The hyper-parameters every family gets from config.json's token ids and the tokenizer."""
    eos, bos = config.get("eos_token_id"), config.get("bos_token_id")
    return {"bos_token_id": bos, "eos_token_ids": eos if isinstance(eos, list) else [eos] * (eos is not None),
            "add_bos": bos is not None and tokenizer.encode("a").ids[:1] == [bos]}


def _chat_template(folder: Path):
    template = _json(folder / "tokenizer_config.json", required=False).get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((entry["template"] for entry in template if entry.get("name") == "default"), None)
    jinja = folder / "chat_template.jinja"
    return template if template is not None or not jinja.is_file() else jinja.read_text()


def _tensors(folder: Path) -> dict:
    """{HF tensor name: (shard, shape, dtype)} over every shard."""
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise ConvertError(folder, "holds no *.safetensors shard")
    SafetensorError, safe_open = _safetensors(folder)
    tensors = {}
    for shard in shards:
        try:
            with safe_open(shard, "numpy") as handle:
                for name in handle.keys():
                    view = handle.get_slice(name)
                    tensors[name] = (shard, tuple(view.get_shape()), view.get_dtype())
        except (SafetensorError, OSError) as error:
            raise ConvertError(shard, f"is not a readable safetensors file: {error}") from None
    return tensors


def _read(shard: Path, name: str, shape: tuple, r0: int, r1: int) -> np.ndarray:
    SafetensorError, safe_open = _safetensors(shard.parent)
    try:
        with safe_open(shard, "numpy") as handle:
            view = handle.get_slice(name)
            rows = view[r0:r1] if len(shape) == 2 else view[:].reshape(1, -1)
    except SafetensorError as error:
        raise ValueError(f"{shard}: {name}: {error}") from None
    return rows.astype(np.float32)


def _rows_of(shard: Path, name: str, shape: tuple, offset: float):
    def rows_of(r0, r1):
        rows = _read(shard, name, shape, r0, r1)
        if offset:
            rows += np.float32(offset)
        return rows
    return rows_of


def read_hf(folder, recipe, families: list) -> Model:
    """The model a Hugging Face folder holds, each weight quantised as `recipe` (a Recipe) chooses.
    `families`: the architectures with import hooks (plugins.Plugins.families)."""
    folder = Path(folder)
    config_path = folder / "config.json"
    config = _json(config_path)
    architectures = config.get("architectures") or [config.get("model_type")]
    try:
        family, taken = taking(families, RAD_SOURCE_HF, [str(name) for name in architectures])
    except ValueError as error:
        raise ConvertError(config_path, str(error)) from None
    tokenizer_path = folder / "tokenizer.json"
    try:
        tokenizer_text = tokenizer_path.read_text()
        tokenizer = Tokenizer.from_str(tokenizer_text)
    except Exception as error:  # tokenizers raises a bare Exception; reading, an OSError
        raise ConvertError(tokenizer_path, f"is not a readable tokenizer.json: {error}") from None
    tensors = _tensors(folder)
    infos = {name: RadWeightInfo(name=name, rows=shape[0] if len(shape) == 2 else 1, cols=shape[-1] if shape else 1,
                                 format=dtype) for name, (_, shape, dtype) in tensors.items()}

    def read_f32(name):
        shard, shape, _ = tensors[name]
        return _read(shard, name, shape, 0, shape[0] if len(shape) == 2 else 1).reshape(-1)

    source = RadSourceInfo(kind=RAD_SOURCE_HF, family=taken, meta=config, tensors=infos, read_f32=read_f32)
    try:
        hyper = family.hyper(source)
    except ValueError as error:
        raise ConvertError(config_path, str(error)) from None
    hyper.update(tokenizer_hyper(config, tokenizer))
    try:
        kept = matched(family.weights(hyper), {name: shape for name, (_, shape, _) in tensors.items()}, "hf", family.name)
    except ValueError as error:
        raise ConvertError(folder, str(error)) from None
    jobs = []
    for spec, tensor in kept:
        shard, shape, dtype = tensors[tensor]
        if dtype not in FLOAT_DTYPES:
            raise ConvertError(shard, f"tensor {tensor!r} is {dtype}, not one of {', '.join(FLOAT_DTYPES)}")
        quantizer, options = recipe.choose(spec.name, len(shape))
        try:
            jobs.append(quantizer.job(spec.name, shape, _rows_of(shard, tensor, shape, spec.hf_offset), options))
        except ValueError as error:
            raise ConvertError(recipe.path, f"weight {spec.name!r}: {error}") from None
    return Model(str(folder), family.name, hyper, tokenizer_text, _chat_template(folder), jobs,
                 {"source_format": "huggingface", "recipe": str(recipe.path)})
