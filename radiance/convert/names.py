"""Our weight names for the llama family, the expected shape of each (llama_weights), and the GGUF
and Hugging Face tensor names that map to them; docs/CONVERT.md has the table."""

import re

LAYER_WEIGHTS = ("attn_norm", "attn.q", "attn.k", "attn.v", "attn.o", "ffn_norm", "ffn.gate", "ffn.up", "ffn.down")
OPTIONAL = ("rope_freqs",)

GGUF_GLOBAL = {"token_embd.weight": "token_embd", "output_norm.weight": "output_norm",
               "output.weight": "output", "rope_freqs.weight": "rope_freqs"}
GGUF_LAYER = {"attn_norm": "attn_norm", "attn_q": "attn.q", "attn_k": "attn.k", "attn_v": "attn.v",
              "attn_output": "attn.o", "ffn_norm": "ffn_norm", "ffn_gate": "ffn.gate", "ffn_up": "ffn.up",
              "ffn_down": "ffn.down"}
GGUF_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")

HF_GLOBAL = {"model.embed_tokens.weight": "token_embd", "model.norm.weight": "output_norm",
             "lm_head.weight": "output"}
HF_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn.q", "self_attn.k_proj": "attn.k",
            "self_attn.v_proj": "attn.v", "self_attn.o_proj": "attn.o",
            "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn.gate", "mlp.up_proj": "ffn.up",
            "mlp.down_proj": "ffn.down"}
HF_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.([\w.]+)\.weight")
HF_DERIVED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")  # recomputed, not stored


def llama_weights(hyper: dict) -> list[tuple[str, tuple]]:
    """(name, shape) of every weight of a llama model, in the order the container holds them."""
    hidden, ffn, vocab, head_dim = hyper["hidden"], hyper["ffn"], hyper["vocab"], hyper["head_dim"]
    q, kv = hyper["heads"] * head_dim, hyper["kv_heads"] * head_dim
    shapes = {"attn_norm": (hidden,), "attn.q": (q, hidden), "attn.k": (kv, hidden), "attn.v": (kv, hidden),
              "attn.o": (hidden, q), "ffn_norm": (hidden,), "ffn.gate": (ffn, hidden), "ffn.up": (ffn, hidden),
              "ffn.down": (hidden, ffn)}
    weights = [("token_embd", (vocab, hidden))]
    for layer in range(hyper["layers"]):
        weights += [(f"layers.{layer}.{weight}", shapes[weight]) for weight in LAYER_WEIGHTS]
    weights.append(("output_norm", (hidden,)))
    if not hyper["tie_embeddings"]:
        weights.append(("output", (vocab, hidden)))
    return weights


def _mapped(name, global_names, layer_names, pattern):
    if name in global_names:
        return global_names[name]
    match = pattern.fullmatch(name)
    if match and match.group(2) in layer_names:
        return f"layers.{int(match.group(1))}.{layer_names[match.group(2)]}"
    return None


def gguf_weight_name(tensor: str) -> str | None:
    """Our name for a GGUF tensor, or None when it is no llama weight."""
    return _mapped(tensor, GGUF_GLOBAL, GGUF_LAYER, GGUF_LAYER_NAME)


def hf_weight_name(tensor: str) -> str | None:
    """Our name for a Hugging Face tensor, or None when it is no llama weight."""
    return _mapped(tensor, HF_GLOBAL, HF_LAYER, HF_LAYER_NAME)


def check_weights(found: dict, hyper: dict, name_in_source: dict) -> list[str]:
    """Our names in container order, after checking `found` ({our name: shape}) against the llama
    weights `hyper` asks for: every one present at its shape, nothing else but OPTIONAL ones.
    `name_in_source` maps our names back to the source's, for the errors. ValueError names the fault."""
    expected = llama_weights(hyper)
    for name, shape in expected:
        if name not in found:
            raise ValueError(f"weight {name!r} is missing")
        if tuple(found[name]) != shape:
            raise ValueError(f"tensor {name_in_source[name]!r} ({name}) has shape {list(found[name])}, "
                             f"the hyper-parameters give {list(shape)}")
    known = {name for name, _ in expected} | set(OPTIONAL)
    extra = [name for name in found if name not in known]
    if extra:
        raise ValueError(f"tensor {name_in_source[extra[0]]!r} ({extra[0]}) is not a weight of this model "
                         f"(tie_embeddings is {hyper['tie_embeddings']})")
    return [name for name in OPTIONAL if name in found] + [name for name, _ in expected]
