"""The container's weight names for the Gemma 3 family (docs/CONVERT.md): every family's embedding
(also the lm head, tied in every Gemma 3), output norm and output (absent when tied), and layer(i,
part) for the parts attn_norm, attn.q, attn.k, attn.v, attn.q_norm, attn.k_norm, attn.o,
attn.post_norm, ffn_norm, ffn.gate, ffn.up, ffn.down, ffn.post_norm."""

from radiance.abi import arch_family as family

EMBEDDING, OUTPUT_NORM, OUTPUT = family.EMBEDDING, family.OUTPUT_NORM, family.OUTPUT
layer = family.layer_name
