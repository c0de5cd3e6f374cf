"""The container's weight names for the llama family (docs/CONVERT.md)."""

EMBEDDING = "token_embd"
OUTPUT_NORM = "output_norm"
OUTPUT = "output"  # absent when the embeddings are tied


def layer(i: int, part: str) -> str:
    """part: attn_norm, attn.q, attn.k, attn.v, attn.o, ffn_norm, ffn.gate, ffn.up, ffn.down."""
    return f"layers.{i}.{part}"
