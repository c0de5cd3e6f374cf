"""GraphBuilder: what every architecture plugin's declare hook writes the same way — weights,
f32 buffers (the KV caches f32 or f16, as the engine's hyper-parameter `kv_cache_dtype` says),
nodes, the two ops whose parameters come from the weights and the hyper-parameters
(gemm: N, K, wdtype; rmsnorm: n, eps), and a decoder's ends: its activation buffers, the embedding
and the head (last tokens, output norm, vocab-parallel lm head, all_gather, sample). A family's
builder adds its own ops on top. Part of the contract package because a plugin imports nothing of
radiance's but it."""

from .arch import RadBufferDecl, RadNodeDecl, RadWeightDecl
from .arch_family import EMBEDDING, OUTPUT, OUTPUT_NORM
from .constants import (
    RAD_DT_F16, RAD_DT_F32, RAD_EXTENT_SEQS, RAD_EXTENT_SLOTS, RAD_EXTENT_TOKENS, RAD_HIDDEN, RAD_SPLIT_COLS,
    RAD_SPLIT_NONE, RAD_SPLIT_ROWS, RAD_STEP_IDS, RAD_STEP_LAST_INDEX, RAD_STEP_RNG, RAD_STEP_TEMPERATURE,
    RAD_STEP_TOKENS, RAD_STEP_TOP_K, RAD_STEP_TOP_P,
)

TOKENS, SEQS = RAD_EXTENT_TOKENS, RAD_EXTENT_SEQS
KV_CACHE_TYPES = {"f32": RAD_DT_F32, "f16": RAD_DT_F16}  # hyper["kv_cache_dtype"], as the engine settled it


class GraphBuilder:
    def __init__(self, hyper: dict, weights: dict):
        self.hyper, self.weights = hyper, weights  # weights: {name: RadWeightInfo}
        self.dtype = hyper.get("activation_dtype", "f32")
        self.nodes, self.buffers, self.declared = [], [], []

    def weight(self, name: str, split: int, source: str = "", parts: int = 0) -> str:
        self.declared.append(RadWeightDecl(name=name, source=source, split=split, parts=parts))
        return name

    def buffer(self, name: str, cols: int, extent: int = TOKENS, split: int = 0, parts: int = 0,
               dtype: int = RAD_DT_F32) -> str:
        self.buffers.append(RadBufferDecl(name=name, dtype=dtype, extent=extent, cols=cols, split=split,
                                          parts=parts))
        return name

    def kv_caches(self, i: int) -> list[str]:
        """Layer i's k and v caches, [slots, kv_heads * head_dim] split as whole kv heads, in the type
        hyper["kv_cache_dtype"] names (the engine's --kv-cache-dtype, settled: f32 where absent)."""
        h = self.hyper
        dtype = KV_CACHE_TYPES[h.get("kv_cache_dtype", "f32")]
        return [self.buffer(f"layers.{i}.{which}_cache", h["kv_heads"] * h["head_dim"], RAD_EXTENT_SLOTS, split=1,
                            parts=h["kv_heads"], dtype=dtype) for which in ("k", "v")]

    def node(self, op, name, operands, extent=TOKENS, split="", **params):
        self.nodes.append(RadNodeDecl(op=op, name=name, extent=extent, params=params, split=split,
                                      operands=tuple(operands)))

    def gemm(self, name, x, weight, y, split, extent=TOKENS, source="", parts=0):
        """y = x . weight^T; split RAD_SPLIT_ROWS shards N, RAD_SPLIT_COLS shards K (as `parts` heads)."""
        info = self.weights[source or weight]
        self.weight(weight, split, source, parts)
        key = {RAD_SPLIT_ROWS: "N", RAD_SPLIT_COLS: "K"}[split]
        self.node("gemm", name, (x, weight, y), extent, split=f"{key}/{parts}" if parts else key,
                  N=info.rows, K=info.cols, wdtype=info.format, dtype=self.dtype)

    def rmsnorm(self, name, x, weight, y, extent=TOKENS):
        self.weight(weight, RAD_SPLIT_NONE)
        self.node("rmsnorm", name, (x, weight, y), extent, n=self.hyper["hidden"],
                  eps=float(self.hyper["rms_eps"]), dtype=self.dtype)

    def decoder_buffers(self) -> None:
        """A decoder layer's activations, [tokens, cols]: h the residual stream, x a normed copy, t a
        partial sum before its all_reduce; q, k, v, attn, gate, up split by columns (k and v as
        whole KV heads, replicated where the ranks outnumber them)."""
        h = self.hyper
        q, kv, kv_heads = h["heads"] * h["head_dim"], h["kv_heads"] * h["head_dim"], h["kv_heads"]
        for name, cols, split, parts in ((RAD_HIDDEN, h["hidden"], 0, 0), ("x", h["hidden"], 0, 0), ("q", q, 1, 0),
                                         ("k", kv, 1, kv_heads), ("v", kv, 1, kv_heads), ("attn", q, 1, 0),
                                         ("t", h["hidden"], 0, 0), ("gate", h["ffn"], 1, 0), ("up", h["ffn"], 1, 0)):
            self.buffer(name, cols, TOKENS, split, parts)

    def embedding(self) -> None:
        """h = token_embd[ids]."""
        self.weight(EMBEDDING, RAD_SPLIT_NONE)
        self.node("embedding", "embedding", (RAD_STEP_IDS, EMBEDDING, RAD_HIDDEN), n=self.hyper["hidden"],
                  vocab=self.hyper["vocab"], wdtype=self.weights[EMBEDDING].format, dtype=self.dtype)

    def head(self, norm: str = OUTPUT_NORM, rows: str = "hs") -> None:
        """Each sequence's last token (into `rows`), normed by weight `norm`, through the
        vocab-parallel lm head (token_embd where there is no output weight: tied), gathered and
        sampled. MTP heads (rad_arch.h) give their own norm and rows RAD_MTP_HIDDEN."""
        hidden, vocab = self.hyper["hidden"], self.hyper["vocab"]
        self.buffer(rows, hidden, SEQS)
        self.buffer("xs", hidden, SEQS)
        self.buffer("logits_part", vocab, SEQS, split=1)
        self.buffer("logits", vocab, SEQS)
        self.node("take_rows", "last_tokens", (RAD_HIDDEN, RAD_STEP_LAST_INDEX, rows), SEQS, n=hidden, dtype=self.dtype)
        self.rmsnorm("output_norm", rows, norm, "xs", SEQS)
        self.gemm("lm_head", "xs", "lm_head", "logits_part", RAD_SPLIT_ROWS, SEQS,
                  source=OUTPUT if OUTPUT in self.weights else EMBEDDING)
        self.node("all_gather", "lm_head.all_gather", ("logits_part", "logits"), SEQS, split="n", n=vocab,
                  dtype=self.dtype)
        self.node("sample", "sample", ("logits", RAD_STEP_TEMPERATURE, RAD_STEP_TOP_K, RAD_STEP_TOP_P, RAD_STEP_RNG,
                                       RAD_STEP_TOKENS), SEQS, vocab=vocab)
