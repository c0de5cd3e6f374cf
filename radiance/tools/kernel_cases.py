"""rad-kbench's cases: every op of the in-tree models at their real geometries and tensor-parallel
slices, in the two bands of the ranged extent the in-tree libraries cut (M = 1 decode, M = 17 a
prefill chunk), and the operands of each filled from a seed.

A case is data (op, parameters, cold-call keys, seed): its operands are generated again from it on
every run, so the fixture file holds only libref's answers and a digest of the inputs they answer.
The 8B shape runs at its TP 8 slice (its vocabulary-sized weights, a 2 GB f32 table, are left out:
libref decodes a weight to f32); SmolLM2 at TP 1 and TP 3 (9 heads, 3 KV heads)."""

import hashlib
from dataclasses import dataclass, field

import numpy as np

from radiance.abi import NUMPY, RAD_DT_ENCODED, RAD_OPD_INOUT, RAD_OPD_OUT, RadTensor, RadWeightPlanes, operand_shapes


@dataclass(frozen=True)
class Model:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    wdtype: str  # the linear weights' format
    head_wdtype: str  # the lm head's / embedding table's
    slices: tuple  # the TP worlds whose per-rank slice is checked
    vocab_ops: bool  # embedding, lm head and sample (vocabulary-sized f32 in libref)


MODELS = {
    "smollm2": Model(576, 9, 3, 64, 1536, 49152, "q4_1", "q8_0", (1, 3), True),
    "llama8b": Model(4096, 32, 8, 128, 14336, 128256, "q4_1", "q8_0", (8,), False),
}
M_VALUES = (1, 17)  # the decode band and a prefill chunk (libr4d's GEMV / GEMM edge is 16 | 17)
EPS = 1e-5
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Case:
    name: str  # model/tpN/label/M=m
    op: str
    params: dict
    cold: dict = field(default_factory=dict)  # opd_shape's cold-call keys: seqs, context, rows
    seed: int = 0

    @property
    def geometry(self) -> dict:
        return {**self.params, **self.cold}


def _seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def _model_cases(label: str, model: Model, tp: int, m: int) -> list[tuple[str, str, dict, dict]]:
    h, hd = model.hidden, model.head_dim
    heads, kv, ffn = model.heads // tp, max(1, model.kv_heads // tp), model.ffn // tp
    base = {"M": m}
    f32 = {"dtype": "f32"}
    gemm = lambda n, k, w=model.wdtype: {**base, "N": n, "K": k, "wdtype": w, **f32}  # noqa: E731
    seqs = min(m, 2)
    attention = {**base, "q_heads": heads, "kv_heads": kv, "head_dim": hd, "block_size": BLOCK_SIZE,
                 "scale": 1.0 / float(np.sqrt(hd)), **f32}
    attention_cold = {"seqs": seqs, "context": m + 31}
    cases = [
        ("rmsnorm", "rmsnorm", {**base, "n": h, "eps": EPS, **f32}, {}),
        ("gemm.q", "gemm", gemm(heads * hd, h), {}),
        ("gemm.k", "gemm", gemm(kv * hd, h), {}),
        ("gemm.v", "gemm", gemm(kv * hd, h), {}),
        ("gemm.o", "gemm", gemm(h, heads * hd), {}),
        ("gemm.gate", "gemm", gemm(ffn, h), {}),
        ("gemm.up", "gemm", gemm(ffn, h), {}),
        ("gemm.down", "gemm", gemm(h, ffn), {}),
        ("rope", "rope", {**base, "q_heads": heads, "kv_heads": kv, "head_dim": hd, "interleaved": 0, **f32}, {}),
        ("attention", "attention", attention, attention_cold),
        ("sliding_attention", "sliding_attention", {**attention, "window": 24}, attention_cold),
        ("add", "add", {**base, "n": h, **f32}, {}),
        ("silu_mul", "silu_mul", {**base, "n": ffn, **f32}, {}),
        ("gelu_tanh_mul", "gelu_tanh_mul", {**base, "n": ffn, **f32}, {}),
        ("rmsnorm_heads", "rmsnorm_heads", {**base, "heads": heads, "head_dim": hd, "eps": EPS, **f32}, {}),
        ("scale", "scale", {**base, "n": h, "scale": 0.125, **f32}, {}),
        ("take_rows", "take_rows", {**base, "n": h, **f32}, {"rows": m + 5}),
        ("gemm_add.o", "gemm_add", {**gemm(h, heads * hd), "n": h}, {}),
        ("rmsnorm_gemm3.qkv", "rmsnorm_gemm3", {**base, "n": h, "eps": EPS, "K": h, "N.1": heads * hd,
                                                "N.2": kv * hd, "N.3": kv * hd, "wdtype": model.wdtype, **f32}, {}),
        ("rmsnorm_gemm2.qk", "rmsnorm_gemm2", {**base, "n": h, "eps": EPS, "K": h, "N.1": heads * hd,
                                               "N.2": kv * hd, "wdtype": model.wdtype, **f32}, {}),
        ("rmsnorm_gemm2_silu_mul.ffn", "rmsnorm_gemm2_silu_mul",
         {**base, "n.0": h, "eps": EPS, "K": h, "N.1": ffn, "N.2": ffn, "wdtype": model.wdtype, **f32}, {}),
        ("add_rmsnorm_gemm3.qkv", "add_rmsnorm_gemm3", {**base, "n": h, "eps": EPS, "K": h, "N.2": heads * hd,
                                                        "N.3": kv * hd, "N.4": kv * hd, "wdtype": model.wdtype, **f32}, {}),
        ("add_rmsnorm_gemm2_silu_mul.ffn", "add_rmsnorm_gemm2_silu_mul",
         {**base, "n.1": h, "eps": EPS, "K": h, "N.2": ffn, "N.3": ffn, "wdtype": model.wdtype, **f32}, {}),
    ]
    if tp == 1:
        cases.append(("gemm.q.bf16", "gemm", gemm(heads * hd, h, "bf16"), {}))
    if model.vocab_ops:
        vocab = model.vocab // tp
        cases.append(("gemm.head", "gemm", gemm(vocab, h, model.head_wdtype), {}))
        if tp == 1:
            cases += [("embedding", "embedding", {**base, "n": h, "vocab": model.vocab, "wdtype": model.head_wdtype,
                                                  **f32}, {}),
                      ("sample", "sample", {**base, "vocab": model.vocab}, {})]
    return cases


def default_cases(models=None) -> list[Case]:
    cases = []
    for label, model in MODELS.items():
        if models and label not in models:
            continue
        for tp in model.slices:
            by_m = [_model_cases(label, model, tp, m) for m in M_VALUES]
            for same in zip(*by_m):  # a case's bands side by side: they share the weight's bytes
                for m, (what, op, params, cold) in zip(M_VALUES, same):
                    name = f"{label}/tp{tp}/{what}/M={m}"
                    cases.append(Case(name, op, params, cold, _seed(name)))
    return cases


# ------------------------------------------------------------------------------------------------
# operands

class Weight:
    """A weight operand before a row's layout hook sees it: its f32 values and their encoding."""

    def __init__(self, values: np.ndarray, planes: RadWeightPlanes):
        self.values, self.planes = values, planes


def _attention_tables(rng, case: Case, shapes) -> dict:
    """slots, positions, cu_seqlens, context_lens, block_tables of `seqs` sequences: the last one a
    decode token, the first the rest of the step's tokens (a prefill chunk), each at the end of its
    context; blocks handed out in a shuffled order."""
    g = case.geometry
    m, seqs, bs = int(g["M"]), int(g.get("seqs", 1)), int(g["block_size"])
    context = int(g.get("context", m))
    tokens = [m] if seqs == 1 else [m - (seqs - 1)] + [1] * (seqs - 1)
    lens = [context - 7 * s for s in range(seqs)]
    max_blocks = -(-context // bs)
    order = rng.permutation(seqs * max_blocks).astype(np.int32)
    tables = order.reshape(seqs, max_blocks)
    positions, slots = [], []
    for s in range(seqs):
        for p in range(lens[s] - tokens[s], lens[s]):
            positions.append(p)
            slots.append(tables[s, p // bs] * bs + p % bs)
    return {"slots": np.array(slots, np.int32), "positions": np.array(positions, np.int32),
            "cu_seqlens": np.concatenate([[0], np.cumsum(tokens)]).astype(np.int32),
            "context_lens": np.array(lens, np.int32), "block_tables": tables}


_WEIGHTS: dict = {}  # the last few weights made: a case's M=1 and M=17 share theirs
KEEP_WEIGHTS = 8


def _weight(case: "Case", name: str, shape, wdtype: str, quantize) -> Weight:
    """A weight drawn from the case's name without its M (so both bands of a case read the same
    bytes), quantised to `wdtype`; a norm's vector near 1 in f32."""
    key = (case.name.rsplit("/M=", 1)[0], name, tuple(shape), wdtype)
    if key not in _WEIGHTS:
        rows, cols = shape
        rng = np.random.default_rng(_seed("/".join(map(str, key))))
        if rows == 1:
            values = np.float32(1) + np.float32(0.1) * rng.standard_normal((1, cols), dtype=np.float32)
            wdtype = "f32"
        else:
            values = np.float32(0.02) * rng.standard_normal((rows, cols), dtype=np.float32)
        while len(_WEIGHTS) >= KEEP_WEIGHTS:
            _WEIGHTS.pop(next(iter(_WEIGHTS)))
        _WEIGHTS[key] = Weight(values, quantize(wdtype, values))
    return _WEIGHTS[key]


def fill(case: Case, schema, quantize) -> list:
    """The operands of `case` in the schema's order: numpy arrays (outputs filled with NaN or -1, so
    an element a row leaves unwritten shows) and Weight objects. `quantize(wdtype, f32) ->
    RadWeightPlanes`."""
    rng = np.random.default_rng(case.seed)
    shapes = operand_shapes(case.op, case.geometry)
    g = case.geometry
    tables = _attention_tables(rng, case, shapes) if "block_size" in g else {}
    operands = []
    for spec, tensor in zip(schema.operands, shapes):
        dims = tuple(int(d) for d in tensor.shape[:tensor.ndim])
        name = spec.name
        if tensor.dtype == RAD_DT_ENCODED:
            operands.append(_weight(case, name, dims, str(g.get("wdtype", "f32")), quantize))
            continue
        dtype = NUMPY[tensor.dtype]
        if name in tables:
            operands.append(tables[name].reshape(dims))
        elif spec.role == RAD_OPD_OUT:
            operands.append(np.full(dims, np.nan if dtype.kind == "f" else -1, dtype))
        elif name == "ids":
            operands.append(rng.integers(0, int(g["vocab"]), dims).astype(dtype))
        elif name == "index":
            operands.append(rng.integers(0, int(g.get("rows", g["M"])), dims).astype(dtype))
        elif name == "positions":
            operands.append((np.arange(dims[0]) * 3 + 5).astype(dtype))
        elif name == "inv_freq":
            operands.append((10000.0 ** (-np.arange(dims[0]) / dims[0])).astype(dtype))
        elif name == "temperature":
            operands.append(np.resize(np.array([0.0, 0.8, 1.2], dtype), dims))
        elif name == "top_k":
            operands.append(np.resize(np.array([0, 40, 0], dtype), dims))
        elif name == "top_p":
            operands.append(np.resize(np.array([1.0, 1.0, 0.9], dtype), dims))
        elif name == "rng":
            operands.append(np.stack([np.arange(dims[0]) + case.seed, np.arange(dims[0])], 1).astype(dtype))
        elif name == "logits":
            operands.append((3 * rng.standard_normal(dims)).astype(dtype))
        else:  # activations: unit normal with a few 8x outlier channels
            values = rng.standard_normal(dims).astype(dtype)
            if len(dims) == 2 and dims[1] > 8:
                values[:, rng.choice(dims[1], 4, replace=False)] *= 8
            operands.append(values)
    return operands


def digest(operands: list) -> str:
    """sha256 of every input's bytes: a fixture answers exactly these."""
    h = hashlib.sha256()
    for operand in operands:
        if isinstance(operand, Weight):
            for plane in operand.planes.planes:
                h.update(np.ascontiguousarray(plane.data if isinstance(plane, RadTensor) else plane).tobytes())
        else:
            h.update(np.ascontiguousarray(operand).tobytes())
    return h.hexdigest()[:16]


READ_ROLES = (RAD_OPD_OUT, RAD_OPD_INOUT)  # the operands a launch leaves answers in
