"""The llama family's checkpoints, for rad-convert (rad_arch.h's import hooks): which sources it
takes, the hyper-parameters each gives, and the weights those call for with their GGUF and Hugging
Face names (docs/CONVERT.md has the tables)."""

from radiance.abi import (
    RAD_FILL_IDENTITY, RAD_FILL_NORMAL, RAD_FILL_ZEROS, RAD_P_F64, RAD_P_INT, RadArchOption, RadWeightSpec,
)
from radiance.abi import arch_family as family

GGUF_FAMILIES = ("llama",)  # llama.cpp writes Llama 2/3, Mistral and SmolLM2 as `llama`
HF_FAMILIES = ("LlamaForCausalLM",)
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1's per-frequency divisors, as llama.cpp writes them

SYNTHETIC = [  # SmolLM2-135M's shape
    RadArchOption("hidden", RAD_P_INT, "576", "model width"),
    RadArchOption("layers", RAD_P_INT, "30", "transformer blocks"),
    RadArchOption("heads", RAD_P_INT, "9", "attention heads"),
    RadArchOption("kv_heads", RAD_P_INT, "3", "key/value heads"),
    RadArchOption("head_dim", RAD_P_INT, "0", "per head (0: hidden / heads)"),
    RadArchOption("ffn", RAD_P_INT, "1536", "feed-forward width"),
    RadArchOption("vocab", RAD_P_INT, "49152", "vocabulary size"),
    RadArchOption("context", RAD_P_INT, "2048", "context length"),
    RadArchOption("rope_theta", RAD_P_F64, "10000", "rope base"),
    RadArchOption("rms_eps", RAD_P_F64, "1e-5", "RMS norm epsilon"),
    RadArchOption("tie_embeddings", RAD_P_INT, "1", "the lm head reads token_embd"),
    RadArchOption("mtp_layers", RAD_P_INT, "0", "1: a multi-token-prediction head (mtp.py), written to draft "
                  "what the model predicts from a token alone (weights())"),
    RadArchOption("mtp_random", RAD_P_INT, "0", "1: the head's weights random like the others' (its drafts are "
                  "rarely kept)"),
]

# (ours, GGUF, Hugging Face) per layer
LAYER = (("attn_norm", "attn_norm", "input_layernorm"), ("attn.q", "attn_q", "self_attn.q_proj"),
         ("attn.k", "attn_k", "self_attn.k_proj"), ("attn.v", "attn_v", "self_attn.v_proj"),
         ("attn.o", "attn_output", "self_attn.o_proj"), ("ffn_norm", "ffn_norm", "post_attention_layernorm"),
         ("ffn.gate", "ffn_gate", "mlp.gate_proj"), ("ffn.up", "ffn_up", "mlp.up_proj"),
         ("ffn.down", "ffn_down", "mlp.down_proj"))


def takes(kind: int, name: str) -> bool:
    return family.takes(kind, name, GGUF_FAMILIES, HF_FAMILIES, "llama")


def _gguf(source) -> dict:
    get = family.getter(source.meta, f"{source.family}.")
    tensors = source.tensors
    if "token_embd.weight" not in tensors:
        raise family.Missing("tensor token_embd.weight is missing")
    hidden, heads = get("embedding_length"), get("attention.head_count")
    hyper = {"hidden": hidden, "layers": get("block_count"), "heads": heads,
             "kv_heads": get("attention.head_count_kv", heads), "head_dim": get("attention.key_length", hidden // heads),
             "ffn": get("feed_forward_length"), "vocab": tensors["token_embd.weight"].rows,
             "context": get("context_length"), "rope_theta": family.f32_decimal(get("rope.freq_base", 10000.0)),
             "rms_eps": family.f32_decimal(get("attention.layer_norm_rms_epsilon")),
             "tie_embeddings": "output.weight" not in tensors, "rope_interleaved": 1}  # llama.cpp permutes q, k
    scaling = family.gguf_rope_scaling(get)
    if scaling:
        hyper["rope_scaling"] = scaling
    if ROPE_FREQS in tensors:  # Llama 3.1: each frequency divided by its factor (the graph's rope table)
        hyper["rope_freq_factors"] = [float(value) for value in source.read_f32(ROPE_FREQS)]
    return hyper


def _hf(source) -> dict:
    get = family.getter(source.meta)
    hidden, heads = get("hidden_size"), get("num_attention_heads")
    hyper = {"hidden": hidden, "layers": get("num_hidden_layers"), "heads": heads,
             "kv_heads": get("num_key_value_heads", heads), "head_dim": get("head_dim", None) or hidden // heads,
             "ffn": get("intermediate_size"), "vocab": get("vocab_size"), "context": get("max_position_embeddings"),
             "rope_theta": float(get("rope_theta", 10000.0)), "rms_eps": float(get("rms_norm_eps")),
             "tie_embeddings": bool(get("tie_word_embeddings", False)), "rope_interleaved": 0}
    scaling = family.hf_rope_scaling(get)
    if scaling:
        hyper["rope_scaling"] = scaling
    return hyper


def _synthetic(source) -> dict:
    shape = source.meta
    problem = family.counts_problem(shape, ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "context"))
    if not problem and not shape["head_dim"] and shape["hidden"] % shape["heads"]:
        problem = f"--hidden {shape['hidden']} is not a multiple of --heads {shape['heads']}"
    problem = problem or family.heads_problem(shape)
    if not problem and shape["mtp_random"] and not shape["mtp_layers"]:
        problem = "--mtp-random 1 is about a head: give --mtp-layers 1 with it"
    if problem:
        return problem
    return {"hidden": shape["hidden"], "layers": shape["layers"], "heads": shape["heads"],
            "kv_heads": shape["kv_heads"], "head_dim": shape["head_dim"] or shape["hidden"] // shape["heads"],
            "ffn": shape["ffn"], "vocab": shape["vocab"], "context": shape["context"],
            "rope_theta": float(shape["rope_theta"]), "rms_eps": float(shape["rms_eps"]),
            "tie_embeddings": bool(shape["tie_embeddings"]), "rope_interleaved": 0,
            **({"mtp_layers": shape["mtp_layers"]} if shape["mtp_layers"] else {}),
            **({"mtp_random": 1} if shape["mtp_layers"] and shape["mtp_random"] else {})}


def hyper(source):
    """The hyper-parameters a source gives, or a one-line reason."""
    return family.read_hyper(source, _gguf, _hf, _synthetic)


def weights(hyper: dict) -> list:
    """Every weight of a llama model, in the container's order, with the tensors a source may hold
    that are not kept: Llama 3.1's rope_freqs (kept as hyper-parameters), Hugging Face's derived
    rotary tables, and its lm_head when the embeddings are tied."""
    hidden, ffn, head_dim = hyper["hidden"], hyper["ffn"], hyper["head_dim"]
    q, kv = hyper["heads"] * head_dim, hyper["kv_heads"] * head_dim
    shapes = {"attn_norm": (hidden,), "attn.q": (q, hidden), "attn.k": (kv, hidden), "attn.v": (kv, hidden),
              "attn.o": (hidden, q), "ffn_norm": (hidden,), "ffn.gate": (ffn, hidden), "ffn.up": (ffn, hidden),
              "ffn.down": (hidden, ffn)}
    specs = [family.weight_spec("", ROPE_FREQS, "", (head_dim // 2,), optional=1, fill=RAD_FILL_NORMAL),
             family.embedding_spec(hyper)]
    for i in range(hyper["layers"]):
        specs += family.layer_specs(i, LAYER, shapes)
        specs.append(RadWeightSpec(name="", hf=f"model.layers.{i}.self_attn.rotary_emb.inv_freq", optional=1))
    return specs + family.head_specs(hyper) + (mtp_specs(hyper, shapes) if hyper.get("mtp_layers") else [])


def mtp_specs(hyper: dict, shapes: dict) -> list:
    """The MTP head's weights (mtp.py), read from no checkpoint yet (no llama checkpoint carries
    one). --synthetic fills them so that the head drafts what the model predicts from the token
    alone, a draft a random head could not be: e_proj the identity and h_proj zero (the head's
    input is the normed embedding of the token), block `layers` an identity (its attn.o and
    ffn.down zero), so the logits are the lm head's over the normed embedding, which the model's
    own step, whose residual stream starts as that embedding, often agrees with. With mtp_random (a
    synthetic model's test of the heads' plumbing) they are random like any other weight."""
    hidden, layers, random = hyper["hidden"], hyper["layers"], bool(hyper.get("mtp_random"))
    fills = {} if random else {"attn.o": RAD_FILL_ZEROS, "ffn.down": RAD_FILL_ZEROS}
    block = [family.weight_spec(family.layer_name(layers, part), "", "", shapes[part], fill=fills.get(part))
             for part, _, _ in LAYER]
    return [family.weight_spec("mtp.enorm", "", "", (hidden,)), family.weight_spec("mtp.hnorm", "", "", (hidden,)),
            family.weight_spec("mtp.e_proj", "", "", (hidden, hidden), fill=None if random else RAD_FILL_IDENTITY),
            family.weight_spec("mtp.h_proj", "", "", (hidden, hidden), fill=None if random else RAD_FILL_ZEROS),
            *block, family.weight_spec("mtp.norm", "", "", (hidden,))]
