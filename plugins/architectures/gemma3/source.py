"""The Gemma 3 family's checkpoints, for rad-convert (rad_arch.h's import hooks): GGUF files of
`gemma3` as llama.cpp writes them, Hugging Face `Gemma3ForCausalLM` folders, `--synthetic gemma3`.

llama.cpp's converter stores every norm as 1 + w (Gemma's RMSNorm multiplies by 1 + w), so a GGUF
norm is the multiplier as it is; a Hugging Face norm is w, and the import adds 1 (hf_offset). The
GGUF keeps q and k in the halves rope layout (llama.cpp ropes Gemma in NEOX order): rope_interleaved 0.
Layer i attends through a sliding window unless (i + 1) % sliding_window_pattern == 0 (llama.cpp's
pattern of 6 for gemma3; Hugging Face's layer_types where it has them); the sliding layers rope
with their own base (rope_local_theta: 10000, llama.cpp's and Hugging Face's rope_local_base_freq)."""

import numpy as np

from radiance.abi import (
    RAD_FILL_NORMAL, RAD_FILL_ONES, RAD_P_F64, RAD_P_INT, RAD_SOURCE_GGUF, RAD_SOURCE_HF, RAD_SOURCE_SYNTHETIC,
    RadArchOption, RadWeightSpec,
)

from . import names

SLIDING, FULL = "sliding", "full"
GGUF_FAMILIES = ("gemma3",)
HF_FAMILIES = ("Gemma3ForCausalLM",)
LOCAL_THETA = 10000.0  # the sliding layers' rope base where the file does not say
PATTERN = 6  # every 6th layer global, the rest sliding (llama.cpp: hparams.set_swa_pattern(6))
NORM_OFFSET = 1.0  # Hugging Face keeps w of (1 + w); llama.cpp's converter stores 1 + w

SYNTHETIC = [  # Gemma 3 270M's shape
    RadArchOption("hidden", RAD_P_INT, "640", "model width"),
    RadArchOption("layers", RAD_P_INT, "18", "transformer blocks"),
    RadArchOption("heads", RAD_P_INT, "4", "attention heads"),
    RadArchOption("kv_heads", RAD_P_INT, "1", "key/value heads"),
    RadArchOption("head_dim", RAD_P_INT, "256", "per head"),
    RadArchOption("ffn", RAD_P_INT, "2048", "feed-forward width"),
    RadArchOption("vocab", RAD_P_INT, "262144", "vocabulary size"),
    RadArchOption("context", RAD_P_INT, "32768", "context length"),
    RadArchOption("rope_theta", RAD_P_F64, "1000000", "rope base of the global layers"),
    RadArchOption("rope_local_theta", RAD_P_F64, "10000", "rope base of the sliding layers"),
    RadArchOption("rms_eps", RAD_P_F64, "1e-6", "RMS norm epsilon"),
    RadArchOption("sliding_window", RAD_P_INT, "512", "positions a sliding layer sees"),
    RadArchOption("sliding_window_pattern", RAD_P_INT, "6", "every Nth layer global"),
    RadArchOption("query_pre_attn_scalar", RAD_P_INT, "0", "scores scaled by its -1/2 power (0: head_dim)"),
]

# (ours, GGUF, Hugging Face) per layer; norms are vectors
LAYER = (("attn_norm", "attn_norm", "input_layernorm"), ("attn.q", "attn_q", "self_attn.q_proj"),
         ("attn.k", "attn_k", "self_attn.k_proj"), ("attn.v", "attn_v", "self_attn.v_proj"),
         ("attn.q_norm", "attn_q_norm", "self_attn.q_norm"), ("attn.k_norm", "attn_k_norm", "self_attn.k_norm"),
         ("attn.o", "attn_output", "self_attn.o_proj"), ("attn.post_norm", "post_attention_norm", "post_attention_layernorm"),
         ("ffn_norm", "ffn_norm", "pre_feedforward_layernorm"), ("ffn.gate", "ffn_gate", "mlp.gate_proj"),
         ("ffn.up", "ffn_up", "mlp.up_proj"), ("ffn.down", "ffn_down", "mlp.down_proj"),
         ("ffn.post_norm", "post_ffw_norm", "post_feedforward_layernorm"))


def takes(kind: int, family: str) -> bool:
    return family in {RAD_SOURCE_GGUF: GGUF_FAMILIES, RAD_SOURCE_HF: HF_FAMILIES,
                      RAD_SOURCE_SYNTHETIC: ("gemma3",)}.get(kind, ())


def f32_decimal(value) -> float:
    """A float stored as f32, as the shortest decimal that reads back as that f32 (1e-06, not 9.99e-07)."""
    return float(str(np.float32(value)))


def layer_types(layers: int, pattern: int) -> list[str]:
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers)]


class _Missing(Exception):
    pass


def _getter(meta: dict, prefix: str = ""):
    def get(key, default=_Missing):
        if prefix + key in meta:
            return meta[prefix + key]
        if default is _Missing:
            raise _Missing(f"metadata {prefix}{key} is missing" if prefix else f"{key} is missing")
        return default
    return get


def _gguf_pattern(get, layers: int) -> list[str]:
    """attention.sliding_window_pattern where a newer converter writes it (a count, or one flag a
    layer: true where it slides), else llama.cpp's 6."""
    pattern = get("attention.sliding_window_pattern", PATTERN)
    if isinstance(pattern, list):
        return [SLIDING if flag else FULL for flag in pattern]
    return layer_types(layers, int(pattern))


def _gguf(source) -> dict:
    get = _getter(source.meta, f"{source.family}.")
    tensors = source.tensors
    if "token_embd.weight" not in tensors:
        raise _Missing("tensor token_embd.weight is missing")
    hidden, heads, layers = get("embedding_length"), get("attention.head_count"), get("block_count")
    head_dim = get("attention.key_length", 256)
    hyper = {"hidden": hidden, "layers": layers, "heads": heads,
             "kv_heads": get("attention.head_count_kv", heads), "head_dim": head_dim,
             "ffn": get("feed_forward_length"), "vocab": tensors["token_embd.weight"].rows,
             "context": get("context_length"), "rope_theta": f32_decimal(get("rope.freq_base", 1000000.0)),
             "rope_local_theta": f32_decimal(get("rope.freq_base_swa", LOCAL_THETA)),
             "rms_eps": f32_decimal(get("attention.layer_norm_rms_epsilon")),
             "sliding_window": get("attention.sliding_window"), "layer_types": _gguf_pattern(get, layers),
             # llama.cpp: head_dim, but hidden / heads for the 27B (62 layers), as Gemma's own config says
             "query_pre_attn_scalar": hidden // heads if layers == 62 else head_dim,
             "tie_embeddings": "output.weight" not in tensors, "rope_interleaved": 0}
    scaling = get("rope.scaling.type", "none")
    if scaling != "none":
        hyper["rope_scaling"] = {"rope_type": scaling, "factor": f32_decimal(get("rope.scaling.factor"))}
    return hyper


def _hf(source) -> dict:
    get = _getter(source.meta)
    hidden, heads, layers = get("hidden_size"), get("num_attention_heads"), get("num_hidden_layers")
    head_dim = get("head_dim", 256)
    types = get("layer_types", None)
    if types is None:
        pattern = get("sliding_window_pattern", None) or get("_sliding_window_pattern", PATTERN)
        types = layer_types(layers, pattern)
    else:
        types = [SLIDING if kind == "sliding_attention" else FULL for kind in types]
    hyper = {"hidden": hidden, "layers": layers, "heads": heads, "kv_heads": get("num_key_value_heads", heads),
             "head_dim": head_dim, "ffn": get("intermediate_size"), "vocab": get("vocab_size"),
             "context": get("max_position_embeddings"), "rope_theta": float(get("rope_theta", 1000000.0)),
             "rope_local_theta": float(get("rope_local_base_freq", LOCAL_THETA)), "rms_eps": float(get("rms_norm_eps")),
             "sliding_window": get("sliding_window"), "layer_types": types,
             "query_pre_attn_scalar": get("query_pre_attn_scalar", head_dim),
             "tie_embeddings": bool(get("tie_word_embeddings", True)), "rope_interleaved": 0}
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if get(key, None) is not None:
            raise _Missing(f"{key} {get(key)} is not supported (Gemma 3 has none)")
    scaling = get("rope_scaling", None)
    if scaling:
        scaling = dict(scaling)
        scaling["rope_type"] = scaling.pop("type", None) or scaling.get("rope_type")
        hyper["rope_scaling"] = scaling
    return hyper


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _synthetic(source) -> dict:
    shape = source.meta
    counts = ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context", "sliding_window",
              "sliding_window_pattern")
    bad = [key for key in counts if shape[key] < 1]
    if bad:
        return f"{flag(bad[0])} {shape[bad[0]]} is not a positive count"
    if shape["heads"] % shape["kv_heads"]:
        return f"--heads {shape['heads']} is not a multiple of --kv-heads {shape['kv_heads']}"
    return {"hidden": shape["hidden"], "layers": shape["layers"], "heads": shape["heads"],
            "kv_heads": shape["kv_heads"], "head_dim": shape["head_dim"], "ffn": shape["ffn"], "vocab": shape["vocab"],
            "context": shape["context"], "rope_theta": float(shape["rope_theta"]),
            "rope_local_theta": float(shape["rope_local_theta"]), "rms_eps": float(shape["rms_eps"]),
            "sliding_window": shape["sliding_window"],
            "layer_types": layer_types(shape["layers"], shape["sliding_window_pattern"]),
            "query_pre_attn_scalar": shape["query_pre_attn_scalar"] or shape["head_dim"],
            "tie_embeddings": True, "rope_interleaved": 0}


def hyper(source):
    """The hyper-parameters a source gives, or a one-line reason."""
    read = {RAD_SOURCE_GGUF: _gguf, RAD_SOURCE_HF: _hf, RAD_SOURCE_SYNTHETIC: _synthetic}[source.kind]
    try:
        return read(source)
    except _Missing as missing:
        return str(missing)


def _spec(name, gguf, hf, shape, optional=0):
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    vector = len(shape) == 1
    return RadWeightSpec(name=name, gguf=gguf, hf=hf, ndim=len(shape), rows=rows, cols=cols, optional=optional,
                         fill=RAD_FILL_ONES if vector else RAD_FILL_NORMAL, hf_offset=NORM_OFFSET if vector else 0.0)


def weights(hyper: dict) -> list:
    """Every weight of a Gemma 3 model, in the container's order (the lm head reads token_embd unless
    the model has an output of its own; a tied Hugging Face lm_head is dropped)."""
    hidden, ffn, vocab, head_dim = hyper["hidden"], hyper["ffn"], hyper["vocab"], hyper["head_dim"]
    q, kv = hyper["heads"] * head_dim, hyper["kv_heads"] * head_dim
    shapes = {"attn_norm": (hidden,), "attn.q": (q, hidden), "attn.k": (kv, hidden), "attn.v": (kv, hidden),
              "attn.q_norm": (head_dim,), "attn.k_norm": (head_dim,), "attn.o": (hidden, q),
              "attn.post_norm": (hidden,), "ffn_norm": (hidden,), "ffn.gate": (ffn, hidden), "ffn.up": (ffn, hidden),
              "ffn.down": (hidden, ffn), "ffn.post_norm": (hidden,)}
    specs = [_spec(names.EMBEDDING, "token_embd.weight", "model.embed_tokens.weight", (vocab, hidden))]
    for i in range(hyper["layers"]):
        specs += [_spec(names.layer(i, ours), f"blk.{i}.{gguf}.weight", f"model.layers.{i}.{hf}.weight", shapes[ours])
                  for ours, gguf, hf in LAYER]
    specs.append(_spec(names.OUTPUT_NORM, "output_norm.weight", "model.norm.weight", (hidden,)))
    tied = hyper["tie_embeddings"]
    specs.append(_spec("" if tied else names.OUTPUT, "output.weight", "lm_head.weight", (vocab, hidden),
                       optional=int(tied)))
    return specs
