"""The graph of one Gemma 3 step and its tensor-parallel plan, declared as data.

    h = embedding(ids) * sqrt(hidden)
    per layer: x = rmsnorm(h) * attn_norm; q, k, v = x . Wq, Wk, Wv; q, k = rmsnorm per head * q_norm,
               k_norm; rope (the layer's own table); attention, through a sliding window on sliding
               layers; t = attn . Wo; all_reduce; h += rmsnorm(t) * post_norm
               x = rmsnorm(h) * ffn_norm; t = (gelu_tanh(x . Wg) * (x . Wu)) . Wd; all_reduce;
               h += rmsnorm(t) * post_norm
    logits = rmsnorm(h[last]) * output_norm . token_embd^T (tied), all_gather, sample

Every norm weight is the multiplier itself (1 + w, as llama.cpp's converter stores it). Column-
parallel q/k/v/gate/up, row-parallel o/down; the KV heads are split as whole heads, replicated where
the ranks outnumber them (Gemma 3 270M has one: every rank holds it at TP 2 and 4)."""

import numpy as np

from radiance.abi import (
    GraphBuilder, RAD_SPLIT_COLS, RAD_SPLIT_NONE, RAD_SPLIT_ROWS, RAD_STEP_BLOCK_TABLES,
    RAD_STEP_CONTEXT_LENS, RAD_STEP_CU_SEQLENS, RAD_STEP_POSITIONS, RAD_STEP_SLOTS, RadGraphDecl, RadTableDecl,
    rad_tensor,
)

from . import names

GLOBAL_TABLE, LOCAL_TABLE = "rope.inv_freq", "rope.inv_freq.local"


def inv_freq(theta: float, head_dim: int, factor: float = 1.0) -> np.ndarray:
    """theta^(-2i/d) / factor, f32 [head_dim / 2] (a linear rope scaling divides every frequency)."""
    return (1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim) / factor).astype(np.float32)


class Builder(GraphBuilder):
    def rmsnorm_heads(self, name, x, weight, heads, split):
        self.weight(weight, RAD_SPLIT_NONE)
        self.node("rmsnorm_heads", name, (x, weight, x), split=split, heads=heads,
                  head_dim=self.hyper["head_dim"], eps=float(self.hyper["rms_eps"]), dtype=self.dtype)


def _layer(b: Builder, i: int) -> None:
    h = b.hyper
    hidden, heads, kv_heads, head_dim = h["hidden"], h["heads"], h["kv_heads"], h["head_dim"]
    sliding = h["layer_types"][i] == "sliding"
    heads_split = f"q_heads kv_heads/{kv_heads}"
    b.rmsnorm(f"layers.{i}.attn_norm", "h", names.layer(i, "attn_norm"), "x")
    for part, parts in (("q", 0), ("k", kv_heads), ("v", kv_heads)):
        b.gemm(f"layers.{i}.attn.{part}", "x", names.layer(i, f"attn.{part}"), part, RAD_SPLIT_ROWS, parts=parts)
    b.rmsnorm_heads(f"layers.{i}.attn.q_norm", "q", names.layer(i, "attn.q_norm"), heads, "heads")
    b.rmsnorm_heads(f"layers.{i}.attn.k_norm", "k", names.layer(i, "attn.k_norm"), kv_heads, f"heads/{kv_heads}")
    b.node("rope", f"layers.{i}.rope", ("q", "k", RAD_STEP_POSITIONS, LOCAL_TABLE if sliding else GLOBAL_TABLE),
           split=heads_split, q_heads=heads, kv_heads=kv_heads, head_dim=head_dim,
           interleaved=int(h.get("rope_interleaved", 0)), dtype=b.dtype)
    caches = b.kv_caches(i)
    operands = ("q", "k", "v", *caches, RAD_STEP_SLOTS, RAD_STEP_POSITIONS, RAD_STEP_CU_SEQLENS,
                RAD_STEP_CONTEXT_LENS, RAD_STEP_BLOCK_TABLES, "attn")
    common = dict(q_heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=int(h.get("block_size", 16)))
    scale = float(h["query_pre_attn_scalar"]) ** -0.5
    if sliding:
        b.node("sliding_attention", f"layers.{i}.attention", operands, split=heads_split, **common,
               window=int(h["sliding_window"]), scale=scale, dtype=b.dtype)
    else:
        b.node("attention", f"layers.{i}.attention", operands, split=heads_split, **common, scale=scale, dtype=b.dtype)
    b.gemm(f"layers.{i}.attn.o", "attn", names.layer(i, "attn.o"), "t", RAD_SPLIT_COLS)
    b.node("all_reduce", f"layers.{i}.attn.all_reduce", ("t",), n=hidden, dtype=b.dtype)
    b.rmsnorm(f"layers.{i}.attn.post_norm", "t", names.layer(i, "attn.post_norm"), "x")
    b.node("add", f"layers.{i}.attn.residual", ("h", "x", "h"), n=hidden, dtype=b.dtype)
    b.rmsnorm(f"layers.{i}.ffn_norm", "h", names.layer(i, "ffn_norm"), "x")
    b.gemm(f"layers.{i}.ffn.gate", "x", names.layer(i, "ffn.gate"), "gate", RAD_SPLIT_ROWS)
    b.gemm(f"layers.{i}.ffn.up", "x", names.layer(i, "ffn.up"), "up", RAD_SPLIT_ROWS)
    b.node("gelu_tanh_mul", f"layers.{i}.ffn.gelu_tanh_mul", ("gate", "up", "gate"), split="n", n=h["ffn"],
           dtype=b.dtype)
    b.gemm(f"layers.{i}.ffn.down", "gate", names.layer(i, "ffn.down"), "t", RAD_SPLIT_COLS)
    b.node("all_reduce", f"layers.{i}.ffn.all_reduce", ("t",), n=hidden, dtype=b.dtype)
    b.rmsnorm(f"layers.{i}.ffn.post_norm", "t", names.layer(i, "ffn.post_norm"), "x")
    b.node("add", f"layers.{i}.ffn.residual", ("h", "x", "h"), n=hidden, dtype=b.dtype)


def declare(hyper: dict, weights: dict) -> RadGraphDecl:
    b = Builder(hyper, weights)
    hidden, head_dim = hyper["hidden"], hyper["head_dim"]
    b.decoder_buffers()
    b.embedding()
    # llama.cpp: ggml_scale(inpL, sqrtf(n_embd)), in f32
    b.node("scale", "embedding.scale", ("h", "h"), n=hidden, scale=float(np.sqrt(np.float32(hidden))), dtype=b.dtype)
    for i in range(hyper["layers"]):
        _layer(b, i)
    b.head()
    factor = (hyper.get("rope_scaling") or {}).get("factor", 1.0)
    tables = [RadTableDecl(name=GLOBAL_TABLE, table=rad_tensor(inv_freq(hyper["rope_theta"], head_dim, factor))),
              RadTableDecl(name=LOCAL_TABLE, table=rad_tensor(inv_freq(hyper["rope_local_theta"], head_dim)))]
    return RadGraphDecl(weights=b.declared, tables=tables, buffers=b.buffers, nodes=b.nodes)
