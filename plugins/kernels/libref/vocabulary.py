"""The op vocabulary libref describes: every op of docs/OPS.md. params[0] is the ranged extent;
extents are per rank (a column-parallel gemm sees N / world)."""

from radiance.abi import (
    RAD_DERIVED, RAD_OPD_IN, RAD_OPD_INOUT, RAD_OPD_OUT, RAD_OPD_WEIGHT, RAD_OPD_WTAB, RAD_OPTIONAL,
    RAD_P_F64, RAD_P_INT, RAD_P_STR, RAD_PROLE_CAPACITY, RAD_PROLE_NONE, RAD_PROLE_SEQ_CHUNK, RAD_REQUIRED,
    RadOperandSpec, RadOpSchema, RadParamSpec,
)

TOKENS = RadParamSpec("M", RAD_P_INT, RAD_REQUIRED, RAD_PROLE_SEQ_CHUNK)  # tokens in this step
DTYPE = RadParamSpec("dtype", RAD_P_STR, RAD_REQUIRED, RAD_PROLE_NONE)  # activations: f32, bf16, f16
WDTYPE = RadParamSpec("wdtype", RAD_P_STR, RAD_REQUIRED, RAD_PROLE_NONE)  # the weight's format: q4_1, bf16...


def integer(name, req=RAD_REQUIRED, role=RAD_PROLE_NONE):
    return RadParamSpec(name, RAD_P_INT, req, role)


def real(name):
    return RadParamSpec(name, RAD_P_F64, RAD_REQUIRED, RAD_PROLE_NONE)


def operand(name, role, fixed=0):
    return RadOperandSpec(name, role, fixed)


def op(name, params, operands, doc):
    return RadOpSchema(op=name, params=params, operands=operands, doc=doc)


SCHEMAS = [
    op("embedding", [TOKENS, integer("n"), integer("vocab"), WDTYPE, DTYPE],
       [operand("ids", RAD_OPD_IN), operand("table", RAD_OPD_WEIGHT, 1), operand("y", RAD_OPD_OUT)],
       "y[m, :] = table[ids[m], :]"),
    op("rmsnorm", [TOKENS, integer("n"), real("eps"), DTYPE],
       [operand("x", RAD_OPD_IN), operand("w", RAD_OPD_WEIGHT, 1), operand("y", RAD_OPD_OUT)],
       "y = x / sqrt(mean(x^2) + eps) * w, per row"),
    op("gemm", [TOKENS, integer("N"), integer("K"), WDTYPE, DTYPE, integer("split_k", RAD_DERIVED)],
       [operand("x", RAD_OPD_IN), operand("w", RAD_OPD_WEIGHT, 1), operand("y", RAD_OPD_OUT)],
       "y[M, N] = x[M, K] . w[N, K]^T"),
    op("rope", [TOKENS, integer("q_heads"), integer("kv_heads"), integer("head_dim"), integer("interleaved"), DTYPE],
       [operand("q", RAD_OPD_INOUT), operand("k", RAD_OPD_INOUT), operand("positions", RAD_OPD_IN),
        operand("inv_freq", RAD_OPD_WTAB, 1)],
       "rotate q and k by position * inv_freq, pairs (2i, 2i+1) when interleaved, else (i, i + d/2)"),
    op("attention", [TOKENS, integer("q_heads"), integer("kv_heads"), integer("head_dim"), integer("block_size"),
                     real("scale"), DTYPE, integer("seqs", RAD_OPTIONAL, RAD_PROLE_CAPACITY)],
       [operand("q", RAD_OPD_IN), operand("k", RAD_OPD_IN), operand("v", RAD_OPD_IN),
        operand("k_cache", RAD_OPD_INOUT, 1), operand("v_cache", RAD_OPD_INOUT, 1),
        operand("slots", RAD_OPD_IN), operand("positions", RAD_OPD_IN), operand("cu_seqlens", RAD_OPD_IN, 1),
        operand("context_lens", RAD_OPD_IN, 1), operand("block_tables", RAD_OPD_IN, 1), operand("out", RAD_OPD_OUT)],
       "store k, v at slots, then causal attention of each token over its sequence's cache"),
    op("sliding_attention", [TOKENS, integer("q_heads"), integer("kv_heads"), integer("head_dim"),
                             integer("block_size"), integer("window"), real("scale"), DTYPE,
                             integer("seqs", RAD_OPTIONAL, RAD_PROLE_CAPACITY)],
       [operand("q", RAD_OPD_IN), operand("k", RAD_OPD_IN), operand("v", RAD_OPD_IN),
        operand("k_cache", RAD_OPD_INOUT, 1), operand("v_cache", RAD_OPD_INOUT, 1),
        operand("slots", RAD_OPD_IN), operand("positions", RAD_OPD_IN), operand("cu_seqlens", RAD_OPD_IN, 1),
        operand("context_lens", RAD_OPD_IN, 1), operand("block_tables", RAD_OPD_IN, 1), operand("out", RAD_OPD_OUT)],
       "attention as `attention`, each token seeing only the last `window` positions up to its own"),
    op("rmsnorm_heads", [TOKENS, integer("heads"), integer("head_dim"), real("eps"), DTYPE],
       [operand("x", RAD_OPD_IN), operand("w", RAD_OPD_WEIGHT, 1), operand("y", RAD_OPD_OUT)],
       "y = x / sqrt(mean(x^2) + eps) * w over each head_dim slice of a row (q and k norms)"),
    op("scale", [TOKENS, integer("n"), real("scale"), DTYPE],
       [operand("x", RAD_OPD_IN), operand("y", RAD_OPD_OUT)],
       "y = x * scale"),
    op("gelu_tanh_mul", [TOKENS, integer("n"), DTYPE],
       [operand("gate", RAD_OPD_IN), operand("up", RAD_OPD_IN), operand("y", RAD_OPD_OUT)],
       "y = gelu_tanh(gate) * up (GeGLU)"),
    op("add", [TOKENS, integer("n"), DTYPE],
       [operand("a", RAD_OPD_IN), operand("b", RAD_OPD_IN), operand("y", RAD_OPD_OUT)],
       "y = a + b"),
    op("silu_mul", [TOKENS, integer("n"), DTYPE],
       [operand("gate", RAD_OPD_IN), operand("up", RAD_OPD_IN), operand("y", RAD_OPD_OUT)],
       "y = gate * sigmoid(gate) * up"),
    op("take_rows", [TOKENS, integer("n"), DTYPE],
       [operand("x", RAD_OPD_IN, 1), operand("index", RAD_OPD_IN), operand("y", RAD_OPD_OUT)],
       "y[m, :] = x[index[m], :]"),
    op("all_reduce", [TOKENS, integer("n"), DTYPE],
       [operand("x", RAD_OPD_INOUT)],
       "x = the sum of every rank's x, in rank order, identical bits on every rank"),
    op("all_gather", [TOKENS, integer("n"), DTYPE],
       [operand("x", RAD_OPD_IN), operand("y", RAD_OPD_OUT)],
       "y[:, r*n:(r+1)*n] = rank r's x[M, n]"),
    op("send", [TOKENS, integer("n"), DTYPE],
       [operand("x", RAD_OPD_IN)],
       "x[M, n] to the same TP rank of the next pipeline stage (a stage boundary the engine cut)"),
    op("recv", [TOKENS, integer("n"), DTYPE],
       [operand("y", RAD_OPD_OUT)],
       "y[M, n] = what the same TP rank of the previous pipeline stage sent, in order"),
    op("all_reduce_add_rmsnorm", [TOKENS, integer("n"), real("eps"), DTYPE],
       [operand("x", RAD_OPD_INOUT), operand("residual", RAD_OPD_INOUT), operand("w", RAD_OPD_WEIGHT, 1),
        operand("y", RAD_OPD_OUT)],
       "x = all_reduce(x); residual = residual + x; y = rmsnorm(residual) * w"),
    op("add_rmsnorm", [TOKENS, integer("n"), real("eps"), DTYPE],
       [operand("residual", RAD_OPD_INOUT), operand("x", RAD_OPD_IN), operand("w", RAD_OPD_WEIGHT, 1),
        operand("y", RAD_OPD_OUT)],
       "residual = residual + x; y = rmsnorm(residual) * w"),
    op("rmsnorm_gemm3", [TOKENS, integer("n"), real("eps"), integer("K"), integer("N.1"), integer("N.2"),
                         integer("N.3"), WDTYPE, DTYPE],
       [operand("x", RAD_OPD_IN), operand("norm", RAD_OPD_WEIGHT, 1), operand("normed", RAD_OPD_OUT),
        operand("wq", RAD_OPD_WEIGHT, 1), operand("q", RAD_OPD_OUT), operand("wk", RAD_OPD_WEIGHT, 1),
        operand("k", RAD_OPD_OUT), operand("wv", RAD_OPD_WEIGHT, 1), operand("v", RAD_OPD_OUT)],
       "normed = rmsnorm(x) * norm; q, k, v = normed . wq^T, normed . wk^T, normed . wv^T"),
    op("rmsnorm_gemm2", [TOKENS, integer("n"), real("eps"), integer("K"), integer("N.1"), integer("N.2"), WDTYPE, DTYPE],
       [operand("x", RAD_OPD_IN), operand("norm", RAD_OPD_WEIGHT, 1), operand("normed", RAD_OPD_OUT),
        operand("wq", RAD_OPD_WEIGHT, 1), operand("q", RAD_OPD_OUT), operand("wk", RAD_OPD_WEIGHT, 1),
        operand("k", RAD_OPD_OUT)],
       "normed = rmsnorm(x) * norm; q, k = normed . wq^T, normed . wk^T"),
    op("rmsnorm_gemm2_silu_mul", [TOKENS, integer("n.0"), real("eps"), integer("K"), integer("N.1"), integer("N.2"),
                                  WDTYPE, DTYPE],
       [operand("x", RAD_OPD_IN), operand("norm", RAD_OPD_WEIGHT, 1), operand("normed", RAD_OPD_OUT),
        operand("wg", RAD_OPD_WEIGHT, 1), operand("gate", RAD_OPD_OUT), operand("wu", RAD_OPD_WEIGHT, 1),
        operand("up", RAD_OPD_OUT)],
       "normed = rmsnorm(x) * norm; up = normed . wu^T; gate = silu(normed . wg^T) * up"),
    op("add_rmsnorm_gemm3", [TOKENS, integer("n"), real("eps"), integer("K"), integer("N.2"), integer("N.3"),
                             integer("N.4"), WDTYPE, DTYPE],
       [operand("residual", RAD_OPD_INOUT), operand("x", RAD_OPD_IN), operand("norm", RAD_OPD_WEIGHT, 1),
        operand("normed", RAD_OPD_OUT), operand("wq", RAD_OPD_WEIGHT, 1), operand("q", RAD_OPD_OUT),
        operand("wk", RAD_OPD_WEIGHT, 1), operand("k", RAD_OPD_OUT), operand("wv", RAD_OPD_WEIGHT, 1),
        operand("v", RAD_OPD_OUT)],
       "residual = residual + x; normed = rmsnorm(residual) * norm; q, k, v = normed . wq^T, normed . wk^T, "
       "normed . wv^T"),
    op("add_rmsnorm_gemm2_silu_mul", [TOKENS, integer("n.1"), real("eps"), integer("K"), integer("N.2"),
                                      integer("N.3"), WDTYPE, DTYPE],
       [operand("residual", RAD_OPD_INOUT), operand("x", RAD_OPD_IN), operand("norm", RAD_OPD_WEIGHT, 1),
        operand("normed", RAD_OPD_OUT), operand("wg", RAD_OPD_WEIGHT, 1), operand("gate", RAD_OPD_OUT),
        operand("wu", RAD_OPD_WEIGHT, 1), operand("up", RAD_OPD_OUT)],
       "residual = residual + x; normed = rmsnorm(residual) * norm; up = normed . wu^T; "
       "gate = silu(normed . wg^T) * up"),
    op("gemm_add", [TOKENS, integer("N"), integer("K"), integer("n"), WDTYPE, DTYPE],
       [operand("x", RAD_OPD_IN), operand("w", RAD_OPD_WEIGHT, 1), operand("y", RAD_OPD_OUT),
        operand("residual", RAD_OPD_INOUT)],
       "y = x . w^T; residual = residual + y"),
    op("rope_attention", [TOKENS, integer("q_heads"), integer("kv_heads"), integer("head_dim"), integer("interleaved"),
                          integer("block_size"), real("scale"), DTYPE],
       [operand("q", RAD_OPD_INOUT), operand("k", RAD_OPD_INOUT), operand("positions", RAD_OPD_IN),
        operand("inv_freq", RAD_OPD_WTAB, 1), operand("v", RAD_OPD_IN), operand("k_cache", RAD_OPD_INOUT, 1),
        operand("v_cache", RAD_OPD_INOUT, 1), operand("slots", RAD_OPD_IN), operand("cu_seqlens", RAD_OPD_IN, 1),
        operand("context_lens", RAD_OPD_IN, 1), operand("block_tables", RAD_OPD_IN, 1), operand("out", RAD_OPD_OUT)],
       "rope(q, k), then attention over the paged cache with this step's k, v stored"),
    op("take_rows_rmsnorm_gemm_sample", [TOKENS, integer("n"), real("eps"), integer("N"), integer("K"), WDTYPE, DTYPE,
                                         integer("vocab")],
       [operand("h", RAD_OPD_IN, 1), operand("index", RAD_OPD_IN), operand("rows", RAD_OPD_OUT),
        operand("norm", RAD_OPD_WEIGHT, 1), operand("normed", RAD_OPD_OUT), operand("w", RAD_OPD_WEIGHT, 1),
        operand("logits", RAD_OPD_OUT), operand("temperature", RAD_OPD_IN), operand("top_k", RAD_OPD_IN),
        operand("top_p", RAD_OPD_IN), operand("rng", RAD_OPD_IN), operand("tokens", RAD_OPD_OUT)],
       "rows = h[index]; normed = rmsnorm(rows) * norm; logits = normed . w^T; tokens = sample(logits)"),
    op("sample", [integer("M"), integer("vocab")],
       [operand("logits", RAD_OPD_IN), operand("temperature", RAD_OPD_IN), operand("top_k", RAD_OPD_IN),
        operand("top_p", RAD_OPD_IN), operand("rng", RAD_OPD_IN), operand("tokens", RAD_OPD_OUT)],
       "one token per row: greedy at temperature 0, else top-k, top-p and a seeded draw"),
]
