"""The container's weight names for the Gemma 3 family (docs/CONVERT.md)."""

EMBEDDING = "token_embd"  # also the lm head where the embeddings are tied (every Gemma 3)
OUTPUT_NORM = "output_norm"
OUTPUT = "output"  # absent when tied


def layer(i: int, part: str) -> str:
    """part: attn_norm, attn.q, attn.k, attn.v, attn.q_norm, attn.k_norm, attn.o, attn.post_norm,
    ffn_norm, ffn.gate, ffn.up, ffn.down, ffn.post_norm."""
    return f"layers.{i}.{part}"
