"""numpy bodies of every row, for a machine where r4d.c cannot be built (no C compiler, or
RADIANCE_R4D_NATIVE=0). Vectorised numpy, no per-element loops: weights are decoded to f32 once
(kept while the weight lives) and multiplied through numpy's matmul; the elementwise rows follow
libref's arithmetic. Correct everywhere, an order of magnitude slower than the native rows on
decode."""

import weakref

import numpy as np

from radiance.abi import RAD_OK, RadTensor, rad_weight_f32

F32 = np.float32
_DECODED: dict = {}


def decoded(operand) -> np.ndarray:
    """The weight as f32 [rows, cols], decoded by the core decoder once per weight object."""
    weight = operand.data if isinstance(operand, RadTensor) else operand
    if isinstance(weight, np.ndarray):
        return weight
    entry = _DECODED.get(id(weight))
    if entry is not None and entry[0]() is weight:
        return entry[1]
    key = id(weight)
    ref = weakref.ref(weight, lambda r, k=key: _DECODED.pop(k, None) if _DECODED.get(k, (None,))[0] is r else None)
    values = np.ascontiguousarray(rad_weight_f32(weight), dtype=F32)
    _DECODED[key] = (ref, values)
    return values


def _sigmoid(values):
    return (1.0 / (1.0 + np.exp(-np.asarray(values, dtype=np.float64)))).astype(F32)


def embedding(a):
    ids, table, y = a.t[0].data, decoded(a.t[1]), a.t[2].data
    m = int(a.params["M"])
    y[:m] = table[ids[:m]]
    return RAD_OK


def _rmsnorm(x, w, y, m, n, eps):
    x = x[:m]
    total = np.zeros(m, F32)
    for k in range(n):  # the sum in column order, vectorised across rows
        total += x[:, k] * x[:, k]
    scale = F32(1.0) / np.sqrt(total / F32(n) + F32(eps))
    y[:m] = (x * scale[:, None]) * np.asarray(w, F32).reshape(-1)[None, :n]


def rmsnorm(a):
    _rmsnorm(a.t[0].data, a.t[1].data, a.t[2].data, int(a.params["M"]), int(a.params["n"]), a.params["eps"])
    return RAD_OK


def gemm(a):
    x, w, y = a.t[0].data, decoded(a.t[1]), a.t[2].data
    m = int(a.params["M"])
    np.matmul(x[:m], w.T, out=y[:m])
    return RAD_OK


def add(a):
    m = int(a.params["M"])
    np.add(a.t[0].data[:m], a.t[1].data[:m], out=a.t[2].data[:m])
    return RAD_OK


def add_rmsnorm(a):
    """residual += x, then y = rmsnorm(residual) * w: add's then rmsnorm's arithmetic."""
    residual, x, w, y = (t.data for t in a.t)
    m = int(a.params["M"])
    np.add(residual[:m], x[:m], out=residual[:m])
    _rmsnorm(residual, w, y, m, int(a.params["n"]), a.params["eps"])
    return RAD_OK


def silu_mul(a):
    gate, up, y = (t.data for t in a.t)
    m = int(a.params["M"])
    y[:m] = (gate[:m] * _sigmoid(gate[:m])) * up[:m]
    return RAD_OK


def take_rows(a):
    x, index, y = (t.data for t in a.t)
    m = int(a.params["M"])
    y[:m] = x[index[:m]]
    return RAD_OK


def _rotate(x, positions, inv_freq, heads, head_dim, interleaved):
    angle = positions.astype(F32)[:, None] * inv_freq.reshape(-1)[None, :]
    cos = np.cos(angle.astype(np.float64)).astype(F32)[:, None, :]
    sin = np.sin(angle.astype(np.float64)).astype(F32)[:, None, :]
    view = x.reshape(x.shape[0], heads, head_dim)
    if interleaved:
        first, second = view[..., 0::2], view[..., 1::2]
    else:
        first, second = view[..., : head_dim // 2], view[..., head_dim // 2:]
    a, b = first.copy(), second.copy()
    first[...] = a * cos - b * sin
    second[...] = a * sin + b * cos


def rope(a):
    q, k, positions, inv_freq = (t.data for t in a.t)
    p = a.params
    m, head_dim, interleaved = int(p["M"]), int(p["head_dim"]), int(p["interleaved"])
    _rotate(q[:m], positions[:m], inv_freq, int(p["q_heads"]), head_dim, interleaved)
    _rotate(k[:m], positions[:m], inv_freq, int(p["kv_heads"]), head_dim, interleaved)
    return RAD_OK


def attention(a):
    """attention, and sliding_attention where the parameters hold a window."""
    q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out = (t.data for t in a.t)
    p = a.params
    m, heads, kv_heads = int(p["M"]), int(p["q_heads"]), int(p["kv_heads"])
    head_dim, block_size, scale = int(p["head_dim"]), int(p["block_size"]), F32(p["scale"])
    window = int(p.get("window", 0))
    k_cache[slots[:m]] = k[:m]
    v_cache[slots[:m]] = v[:m]
    group = heads // kv_heads
    for s in range(len(cu_seqlens) - 1):
        t0, t1 = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        if t1 == t0:
            continue
        length = int(context_lens[s])
        j = np.arange(length)
        cached = block_tables[s][j // block_size] * block_size + j % block_size
        # an f16 cache's rows widened exactly: the f32 arithmetic on the stored (rounded) values
        keys = k_cache[cached].astype(F32).reshape(length, kv_heads, head_dim).repeat(group, axis=1)
        values = v_cache[cached].astype(F32).reshape(length, kv_heads, head_dim).repeat(group, axis=1)
        query = q[t0:t1].reshape(t1 - t0, heads, head_dim)
        scores = np.einsum("thd,jhd->thj", query, keys) * scale
        visible = j[None, None, :] <= positions[t0:t1, None, None]
        if window > 0:  # sliding_attention: positions p - window < j <= p
            visible &= j[None, None, :] > positions[t0:t1, None, None] - window
        scores = np.where(visible, scores, F32(-np.inf))
        weights = np.exp((scores - scores.max(axis=2, keepdims=True)).astype(np.float64)).astype(F32)
        mixed = np.einsum("thj,jhd->thd", weights, values)
        out[t0:t1] = (mixed / weights.sum(axis=2)[:, :, None]).reshape(t1 - t0, heads * head_dim)
    return RAD_OK


sliding_attention = attention


def scale(a):
    m = int(a.params["M"])
    np.multiply(a.t[0].data[:m], F32(a.params["scale"]), out=a.t[1].data[:m])
    return RAD_OK


def rmsnorm_heads(a):
    """rmsnorm over each head_dim slice of a row, the sum in column order."""
    x, w, y = a.t[0].data, a.t[1].data, a.t[2].data
    p = a.params
    m, heads, head_dim = int(p["M"]), int(p["heads"]), int(p["head_dim"])
    x = x[:m, :heads * head_dim].reshape(m, heads, head_dim)
    total = np.zeros((m, heads), F32)
    for k in range(head_dim):
        total += x[:, :, k] * x[:, :, k]
    scale = F32(1.0) / np.sqrt(total / F32(head_dim) + F32(p["eps"]))
    w = np.asarray(w, F32).reshape(-1)[None, None, :head_dim]
    y[:m, :heads * head_dim] = ((x * scale[:, :, None]) * w).reshape(m, -1)
    return RAD_OK


def gelu_tanh_mul(a):
    gate, up, y = (t.data for t in a.t)
    m = int(a.params["M"])
    g = gate[:m].astype(np.float64)
    y[:m] = (0.5 * g * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g + 0.044715 * g * g * g)))).astype(F32) * up[:m]
    return RAD_OK
