"""Hugging Face folder import, llama family: config.json (LlamaForCausalLM), *.safetensors shards
read tensor by tensor and slice by slice (memory bounded by a row block), tokenizer.json and the
chat template (tokenizer_config.json or chat_template.jinja). Every weight is quantised as the recipe
says. HF keeps q/k in the halves rope layout: rope_interleaved 0."""

import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer

from .errors import ConvertError
from .names import HF_DERIVED, check_weights, hf_weight_name
from .pipeline import Model

ARCHITECTURES = ("LlamaForCausalLM",)
FLOAT_DTYPES = ("F32", "F16", "BF16")


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


def _hyper(config: dict, tokenizer: Tokenizer, path: Path) -> dict:
    def get(key, default=KeyError):
        if key not in config and default is KeyError:
            raise ConvertError(path, f"{key} is missing")
        return config.get(key, default)

    hidden, heads = get("hidden_size"), get("num_attention_heads")
    eos = get("eos_token_id", None)
    bos = get("bos_token_id", None)
    hyper = {"hidden": hidden, "layers": get("num_hidden_layers"), "heads": heads,
             "kv_heads": get("num_key_value_heads", heads), "head_dim": get("head_dim", None) or hidden // heads,
             "ffn": get("intermediate_size"), "vocab": get("vocab_size"), "context": get("max_position_embeddings"),
             "rope_theta": float(get("rope_theta", 10000.0)), "rms_eps": float(get("rms_norm_eps")),
             "tie_embeddings": bool(get("tie_word_embeddings", False)), "rope_interleaved": 0,
             "bos_token_id": bos, "eos_token_ids": eos if isinstance(eos, list) else [eos] * (eos is not None),
             "add_bos": bos is not None and tokenizer.encode("a").ids[:1] == [bos]}
    scaling = get("rope_scaling", None)
    if scaling:
        scaling = dict(scaling)
        scaling["rope_type"] = scaling.pop("type", None) or scaling.get("rope_type")
        hyper["rope_scaling"] = scaling
    return hyper


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


def _rows_of(shard: Path, name: str, shape: tuple):
    def rows_of(r0, r1):
        try:
            with safe_open(shard, "numpy") as handle:
                view = handle.get_slice(name)
                rows = view[r0:r1] if len(shape) == 2 else view[:].reshape(1, -1)
        except SafetensorError as error:
            raise ValueError(f"{shard}: {name}: {error}") from None
        return rows.astype(np.float32)
    return rows_of


def read_hf(folder, recipe) -> Model:
    """The model a Hugging Face folder holds, each weight quantised as `recipe` (a Recipe) chooses."""
    folder = Path(folder)
    config = _json(folder / "config.json")
    architectures = config.get("architectures") or [config.get("model_type")]
    if not set(architectures) & set(ARCHITECTURES):
        raise ConvertError(folder / "config.json", f"architecture {architectures} is not imported "
                                                   f"(rad-convert imports {', '.join(ARCHITECTURES)})")
    tokenizer_path = folder / "tokenizer.json"
    try:
        tokenizer_text = tokenizer_path.read_text()
        tokenizer = Tokenizer.from_str(tokenizer_text)
    except Exception as error:  # tokenizers raises a bare Exception; reading, an OSError
        raise ConvertError(tokenizer_path, f"is not a readable tokenizer.json: {error}") from None
    hyper = _hyper(config, tokenizer, folder / "config.json")
    found, sources = {}, {}
    for tensor, (shard, shape, dtype) in _tensors(folder).items():
        name = hf_weight_name(tensor)
        if HF_DERIVED.fullmatch(tensor) or name == "output" and hyper["tie_embeddings"]:
            continue
        if name is None:
            raise ConvertError(shard, f"tensor {tensor!r} is no llama weight that rad-convert knows")
        if dtype not in FLOAT_DTYPES:
            raise ConvertError(shard, f"tensor {tensor!r} is {dtype}, not one of {', '.join(FLOAT_DTYPES)}")
        found[name], sources[name] = (shape, shard), tensor
    try:
        order = check_weights({name: shape for name, (shape, _) in found.items()}, hyper, sources)
    except ValueError as error:
        raise ConvertError(folder, str(error)) from None
    jobs = []
    for name in order:
        shape, shard = found[name]
        quantizer, options = recipe.choose(name, len(shape))
        try:
            jobs.append(quantizer.job(name, shape, _rows_of(shard, sources[name], shape), options))
        except ValueError as error:
            raise ConvertError(recipe.path, f"weight {name!r}: {error}") from None
    return Model(str(folder), "llama", hyper, tokenizer_text, _chat_template(folder), jobs,
                 {"source_format": "huggingface", "recipe": str(recipe.path)})
