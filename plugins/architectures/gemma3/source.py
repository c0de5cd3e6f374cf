"""The Gemma 3 family's checkpoints, for rad-convert (rad_arch.h's import hooks): GGUF files of
`gemma3` as llama.cpp writes them, Hugging Face `Gemma3ForCausalLM` folders, `--synthetic gemma3`.

llama.cpp's converter stores every norm as 1 + w (Gemma's RMSNorm multiplies by 1 + w), so a GGUF
norm is the multiplier as it is; a Hugging Face norm is w, and the import adds 1 (hf_offset). The
GGUF keeps q and k in the halves rope layout (llama.cpp ropes Gemma in NEOX order): rope_interleaved 0.
Layer i attends through a sliding window unless (i + 1) % sliding_window_pattern == 0 (llama.cpp's
pattern of 6 for gemma3; Hugging Face's layer_types where it has them); the sliding layers rope
with their own base (rope_local_theta: 10000, llama.cpp's and Hugging Face's rope_local_base_freq)."""

from radiance.abi import RAD_P_F64, RAD_P_INT, RadArchOption
from radiance.abi import arch_family as family

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


def takes(kind: int, name: str) -> bool:
    return family.takes(kind, name, GGUF_FAMILIES, HF_FAMILIES, "gemma3")


def layer_types(layers: int, pattern: int) -> list[str]:
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers)]


def _gguf_pattern(get, layers: int) -> list[str]:
    """attention.sliding_window_pattern where a newer converter writes it (a count, or one flag a
    layer: true where it slides), else llama.cpp's 6."""
    pattern = get("attention.sliding_window_pattern", PATTERN)
    if isinstance(pattern, list):
        return [SLIDING if flag else FULL for flag in pattern]
    return layer_types(layers, int(pattern))


def _gguf(source) -> dict:
    get = family.getter(source.meta, f"{source.family}.")
    tensors = source.tensors
    if "token_embd.weight" not in tensors:
        raise family.Missing("tensor token_embd.weight is missing")
    hidden, heads, layers = get("embedding_length"), get("attention.head_count"), get("block_count")
    head_dim = get("attention.key_length", 256)
    hyper = {"hidden": hidden, "layers": layers, "heads": heads,
             "kv_heads": get("attention.head_count_kv", heads), "head_dim": head_dim,
             "ffn": get("feed_forward_length"), "vocab": tensors["token_embd.weight"].rows,
             "context": get("context_length"), "rope_theta": family.f32_decimal(get("rope.freq_base", 1000000.0)),
             "rope_local_theta": family.f32_decimal(get("rope.freq_base_swa", LOCAL_THETA)),
             "rms_eps": family.f32_decimal(get("attention.layer_norm_rms_epsilon")),
             "sliding_window": get("attention.sliding_window"), "layer_types": _gguf_pattern(get, layers),
             # llama.cpp: head_dim, but hidden / heads for the 27B (62 layers), as Gemma's own config says
             "query_pre_attn_scalar": hidden // heads if layers == 62 else head_dim,
             "tie_embeddings": "output.weight" not in tensors, "rope_interleaved": 0}
    scaling = family.gguf_rope_scaling(get)
    if scaling:
        hyper["rope_scaling"] = scaling
    return hyper


def _hf(source) -> dict:
    get = family.getter(source.meta)
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
            raise family.Missing(f"{key} {get(key)} is not supported (Gemma 3 has none)")
    scaling = family.hf_rope_scaling(get)
    if scaling:
        hyper["rope_scaling"] = scaling
    return hyper


def _synthetic(source) -> dict:
    shape = source.meta
    counts = ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context", "sliding_window",
              "sliding_window_pattern")
    problem = family.counts_problem(shape, counts) or family.heads_problem(shape)
    if problem:
        return problem
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
    return family.read_hyper(source, _gguf, _hf, _synthetic)


def weights(hyper: dict) -> list:
    """Every weight of a Gemma 3 model, in the container's order (the lm head reads token_embd unless
    the model has an output of its own; a tied Hugging Face lm_head is dropped)."""
    hidden, ffn, head_dim = hyper["hidden"], hyper["ffn"], hyper["head_dim"]
    q, kv = hyper["heads"] * head_dim, hyper["kv_heads"] * head_dim
    shapes = {"attn_norm": (hidden,), "attn.q": (q, hidden), "attn.k": (kv, hidden), "attn.v": (kv, hidden),
              "attn.q_norm": (head_dim,), "attn.k_norm": (head_dim,), "attn.o": (hidden, q),
              "attn.post_norm": (hidden,), "ffn_norm": (hidden,), "ffn.gate": (ffn, hidden), "ffn.up": (ffn, hidden),
              "ffn.down": (hidden, ffn), "ffn.post_norm": (hidden,)}
    specs = [family.embedding_spec(hyper)]
    for i in range(hyper["layers"]):
        specs += family.layer_specs(i, LAYER, shapes, hf_offset=NORM_OFFSET)
    return specs + family.head_specs(hyper, hf_offset=NORM_OFFSET)
