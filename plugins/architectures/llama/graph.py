"""The graph of one llama step and its tensor-parallel plan, declared as data: column-parallel
q/k/v/gate/up (their N split), row-parallel o/down (their K split) each followed by all_reduce, a
vocab-parallel lm head followed by all_gather. The KV heads are split as whole heads (parts), so
where the ranks outnumber them each is replicated (rad_arch.h). The same graph serves TP 1 and TP N."""

from radiance.abi import (
    GraphBuilder, RAD_SPLIT_COLS, RAD_SPLIT_ROWS, RAD_STEP_BLOCK_TABLES, RAD_STEP_CONTEXT_LENS,
    RAD_STEP_CU_SEQLENS, RAD_STEP_POSITIONS, RAD_STEP_SLOTS, RadGraphDecl, RadTableDecl, rad_tensor,
)

from . import names
from .rope import inv_freq


Builder = GraphBuilder  # llama declares only the common ops through it


def layer(b: Builder, i: int) -> None:
    """Block i, from h to h (mtp.py's head is block `layers`)."""
    h = b.hyper
    hidden, heads, kv_heads, head_dim = h["hidden"], h["heads"], h["kv_heads"], h["head_dim"]
    heads_split = f"q_heads kv_heads/{kv_heads}"
    b.rmsnorm(f"layers.{i}.attn_norm", "h", names.layer(i, "attn_norm"), "x")
    for part, parts in (("q", 0), ("k", kv_heads), ("v", kv_heads)):
        b.gemm(f"layers.{i}.attn.{part}", "x", names.layer(i, f"attn.{part}"), part, RAD_SPLIT_ROWS, parts=parts)
    b.node("rope", f"layers.{i}.rope", ("q", "k", RAD_STEP_POSITIONS, "rope.inv_freq"), split=heads_split,
           q_heads=heads, kv_heads=kv_heads, head_dim=head_dim,
           interleaved=int(h.get("rope_interleaved", 0)), dtype=b.dtype)
    caches = b.kv_caches(i)
    b.node("attention", f"layers.{i}.attention",
           ("q", "k", "v", *caches, RAD_STEP_SLOTS, RAD_STEP_POSITIONS, RAD_STEP_CU_SEQLENS,
            RAD_STEP_CONTEXT_LENS, RAD_STEP_BLOCK_TABLES, "attn"),
           split=heads_split, q_heads=heads, kv_heads=kv_heads, head_dim=head_dim,
           block_size=int(h.get("block_size", 16)), scale=head_dim ** -0.5, dtype=b.dtype)
    b.gemm(f"layers.{i}.attn.o", "attn", names.layer(i, "attn.o"), "t", RAD_SPLIT_COLS)
    b.node("all_reduce", f"layers.{i}.attn.all_reduce", ("t",), n=hidden, dtype=b.dtype)
    b.node("add", f"layers.{i}.attn.residual", ("h", "t", "h"), n=hidden, dtype=b.dtype)
    b.rmsnorm(f"layers.{i}.ffn_norm", "h", names.layer(i, "ffn_norm"), "x")
    b.gemm(f"layers.{i}.ffn.gate", "x", names.layer(i, "ffn.gate"), "gate", RAD_SPLIT_ROWS)
    b.gemm(f"layers.{i}.ffn.up", "x", names.layer(i, "ffn.up"), "up", RAD_SPLIT_ROWS)
    b.node("silu_mul", f"layers.{i}.ffn.silu_mul", ("gate", "up", "gate"), split="n", n=h["ffn"], dtype=b.dtype)
    b.gemm(f"layers.{i}.ffn.down", "gate", names.layer(i, "ffn.down"), "t", RAD_SPLIT_COLS)
    b.node("all_reduce", f"layers.{i}.ffn.all_reduce", ("t",), n=hidden, dtype=b.dtype)
    b.node("add", f"layers.{i}.ffn.residual", ("h", "t", "h"), n=hidden, dtype=b.dtype)


def declare(hyper: dict, weights: dict) -> RadGraphDecl:
    b = Builder(hyper, weights)
    b.decoder_buffers()
    b.embedding()
    for i in range(hyper["layers"]):
        layer(b, i)
    b.head()
    tables = [RadTableDecl(name="rope.inv_freq", table=rad_tensor(inv_freq(hyper)))]
    return RadGraphDecl(weights=b.declared, tables=tables, buffers=b.buffers, nodes=b.nodes)
