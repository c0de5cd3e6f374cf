"""What every architecture family's import hooks and checks write the same way (rad_arch.h): reading a
source's metadata (a missing key is a one-line reason), f32 values as short decimals, the synthetic
options' flags and counts, the hyper-parameters both families require, and the weight table built
from a family's (ours, GGUF, Hugging Face) layer names. Beside GraphBuilder in the contract package,
because a plugin imports nothing of radiance's but it; a family keeps only what is its own."""

import numpy as np

from .arch import RadWeightSpec
from .constants import RAD_FILL_NORMAL, RAD_FILL_ONES, RAD_SOURCE_GGUF, RAD_SOURCE_HF, RAD_SOURCE_SYNTHETIC

EMBEDDING = "token_embd"  # also the lm head where the embeddings are tied
OUTPUT_NORM = "output_norm"
OUTPUT = "output"  # absent when tied


def layer_name(i: int, part: str) -> str:
    """The container's name of layer i's weight `part` (a family's names.py lists its parts)."""
    return f"layers.{i}.{part}"


def f32_decimal(value) -> float:
    """A float stored as f32, as the shortest decimal that reads back as that f32 (1e-05, not 9.99e-06)."""
    return float(str(np.float32(value)))


class Missing(Exception):
    """What a source lacks; its text is the one-line reason rad-convert prints."""


_REQUIRED = object()


def getter(meta: dict, prefix: str = ""):
    """get(key[, default]): meta[prefix + key], else the default, else Missing naming the key."""
    def get(key, default=_REQUIRED):
        if prefix + key in meta:
            return meta[prefix + key]
        if default is _REQUIRED:
            raise Missing(f"metadata {prefix}{key} is missing" if prefix else f"{key} is missing")
        return default
    return get


def takes(kind: int, family: str, gguf: tuple, hf: tuple, synthetic: str) -> bool:
    """Whether a family reads a source of `kind` whose own family name is `family`."""
    return family in {RAD_SOURCE_GGUF: gguf, RAD_SOURCE_HF: hf, RAD_SOURCE_SYNTHETIC: (synthetic,)}.get(kind, ())


def read_hyper(source, gguf, hf, synthetic):
    """The hyper-parameters the reader of the source's kind gives, or a one-line reason (the text a
    reader returns, or that of the Missing it raises)."""
    read = {RAD_SOURCE_GGUF: gguf, RAD_SOURCE_HF: hf, RAD_SOURCE_SYNTHETIC: synthetic}[source.kind]
    try:
        return read(source)
    except Missing as missing:
        return str(missing)


def gguf_rope_scaling(get) -> dict | None:
    """rope.scaling.* as Hugging Face's rope_scaling spells it, or None where the file has none."""
    kind = get("rope.scaling.type", "none")
    if kind == "none":
        return None
    scaling = {"rope_type": kind, "factor": f32_decimal(get("rope.scaling.factor"))}
    original = get("rope.scaling.original_context_length", None)
    if original is not None:
        scaling["original_max_position_embeddings"] = original
    return scaling


def hf_rope_scaling(get) -> dict | None:
    """config.json's rope_scaling with its type as rope_type (older configs say type), or None."""
    scaling = get("rope_scaling", None)
    if not scaling:
        return None
    scaling = dict(scaling)
    scaling["rope_type"] = scaling.pop("type", None) or scaling.get("rope_type")
    return scaling


def flag(key: str) -> str:
    """A synthetic option as rad-convert's command line spells it."""
    return "--" + key.replace("_", "-")


def counts_problem(shape: dict, keys) -> str:
    """'' when each of a synthetic shape's `keys` is a positive count, else the first that is not."""
    bad = [key for key in keys if shape[key] < 1]
    return f"{flag(bad[0])} {shape[bad[0]]} is not a positive count" if bad else ""


def heads_problem(shape: dict) -> str:
    """'' when a synthetic shape's heads share its KV heads evenly, else the reason."""
    if shape["heads"] % shape["kv_heads"]:
        return f"--heads {shape['heads']} is not a multiple of --kv-heads {shape['kv_heads']}"
    return ""


def hyper_problem(hyper: dict, integers, reals) -> str:
    """'' when `integers` are positive integers, `reals` positive numbers, the heads a multiple of the
    KV heads and head_dim even (rope), else a one-line reason: what every family's check asks first."""
    for key in integers:
        value = hyper.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"hyper-parameter '{key}' must be a positive integer, not {value!r}"
    for key in reals:
        value = hyper.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            return f"hyper-parameter '{key}' must be a positive number, not {value!r}"
    if hyper["heads"] % hyper["kv_heads"]:
        return f"heads ({hyper['heads']}) must be a multiple of kv_heads ({hyper['kv_heads']})"
    if hyper["head_dim"] % 2:
        return f"head_dim ({hyper['head_dim']}) must be even for rope"
    return ""


def weight_spec(name: str, gguf: str, hf: str, shape: tuple, optional: int = 0, fill: int | None = None,
                hf_offset: float = 0.0) -> RadWeightSpec:
    """One weight: a vector (one dimension) is a row, filled with ones by --synthetic unless `fill`
    says; a matrix is filled normally. hf_offset is added to a vector read from Hugging Face."""
    vector = len(shape) == 1
    rows, cols = (1, shape[0]) if vector else shape
    if fill is None:
        fill = RAD_FILL_ONES if vector else RAD_FILL_NORMAL
    return RadWeightSpec(name=name, gguf=gguf, hf=hf, ndim=len(shape), rows=rows, cols=cols, optional=optional,
                         fill=fill, hf_offset=hf_offset if vector else 0.0)


def embedding_spec(hyper: dict) -> RadWeightSpec:
    return weight_spec(EMBEDDING, "token_embd.weight", "model.embed_tokens.weight", (hyper["vocab"], hyper["hidden"]))


def layer_specs(i: int, table, shapes: dict, hf_offset: float = 0.0) -> list:
    """Layer i's weights from a family's table of (ours, GGUF, Hugging Face) names and its {ours: shape}."""
    return [weight_spec(layer_name(i, ours), f"blk.{i}.{gguf}.weight", f"model.layers.{i}.{hf}.weight", shapes[ours],
                        hf_offset=hf_offset) for ours, gguf, hf in table]


def head_specs(hyper: dict, hf_offset: float = 0.0) -> list:
    """The output norm, and the lm head: kept unless the embeddings are tied (a tied source's copy is
    dropped)."""
    tied = hyper["tie_embeddings"]
    return [weight_spec(OUTPUT_NORM, "output_norm.weight", "model.norm.weight", (hyper["hidden"],),
                        hf_offset=hf_offset),
            weight_spec("" if tied else OUTPUT, "output.weight", "lm_head.weight", (hyper["vocab"], hyper["hidden"]),
                        optional=int(tied))]


def shape_problem(specs, weights: dict, family: str) -> str:
    """'' when every weight of `specs` (a family's weights hook) is among `weights` ({name:
    RadWeightInfo}) at its shape, else a one-line reason (an optional one may be absent)."""
    for spec in specs:
        if not spec.name or spec.optional and spec.name not in weights:
            continue
        if spec.name not in weights:
            return f"weight '{spec.name}' is missing"
        found = (weights[spec.name].rows, weights[spec.name].cols)
        if found != (spec.rows, spec.cols):
            return (f"weight '{spec.name}' is {found[0]}x{found[1]}, {family} with these hyper-parameters "
                    f"needs {spec.rows}x{spec.cols}")
    return ""
