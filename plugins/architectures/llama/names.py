"""The container's weight names for the llama family (docs/CONVERT.md): every family's embedding,
output norm and output (absent when the embeddings are tied), and layer(i, part) for the parts
attn_norm, attn.q, attn.k, attn.v, attn.o, ffn_norm, ffn.gate, ffn.up, ffn.down; a model with an MTP
head (mtp.py) adds mtp(part) for the parts enorm, hnorm, e_proj, h_proj, norm, and block `layers`'s
layer(layers, part)."""

from radiance.abi import arch_family as family

EMBEDDING, OUTPUT_NORM, OUTPUT = family.EMBEDDING, family.OUTPUT_NORM, family.OUTPUT
layer = family.layer_name


def mtp(part: str) -> str:
    return f"mtp.{part}"
