"""Reference rope and attention over a paged KV cache. Caches are [slots, kv_heads * head_dim], f32
or f16 (the engine's --kv-cache-dtype): an f16 cache stores k, v rounded to nearest even (numpy's
assignment) and its rows are widened exactly, so the arithmetic is f32's on the rounded values;
the slot of position j of sequence s is block_tables[s, j // block_size] * block_size + j % block_size."""

import numpy as np

from radiance.abi import RAD_OK, rad_args_getf, rad_args_geti

from .ordered import F32, exp32


def _rotate(x, positions, inv_freq, heads, head_dim, interleaved):
    """x [M, heads * head_dim] in place: (a, b) -> (a*cos - b*sin, a*sin + b*cos)."""
    angle = positions.astype(F32)[:, None] * inv_freq[None, :]  # [M, head_dim/2]
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
    m, head_dim = rad_args_geti(a, "M"), rad_args_geti(a, "head_dim")
    interleaved = rad_args_geti(a, "interleaved")
    _rotate(q[:m], positions[:m], inv_freq, rad_args_geti(a, "q_heads"), head_dim, interleaved)
    _rotate(k[:m], positions[:m], inv_freq, rad_args_geti(a, "kv_heads"), head_dim, interleaved)
    return RAD_OK


def _slots(block_table, block_size, length):
    positions = np.arange(length)
    return block_table[positions // block_size] * block_size + positions % block_size


def sliding_attention(a):
    """attention, each token at position p seeing positions p - window < j <= p."""
    return _attend(a, rad_args_geti(a, "window"))


def attention(a):
    return _attend(a, None)


def _attend(a, window):
    q, k, v, k_cache, v_cache, slots, positions, cu_seqlens, context_lens, block_tables, out = (t.data for t in a.t)
    m = rad_args_geti(a, "M")
    heads, kv_heads = rad_args_geti(a, "q_heads"), rad_args_geti(a, "kv_heads")
    head_dim, block_size = rad_args_geti(a, "head_dim"), rad_args_geti(a, "block_size")
    scale = F32(rad_args_getf(a, "scale"))
    k_cache[slots[:m]] = k[:m]
    v_cache[slots[:m]] = v[:m]
    group = heads // kv_heads
    for s in range(len(cu_seqlens) - 1):
        t0, t1 = int(cu_seqlens[s]), int(cu_seqlens[s + 1])
        if t1 == t0:
            continue
        length = int(context_lens[s])
        cached = _slots(block_tables[s], block_size, length)
        keys = k_cache[cached].astype(F32).reshape(length, kv_heads, head_dim).repeat(group, axis=1)  # [J, H, D]
        values = v_cache[cached].astype(F32).reshape(length, kv_heads, head_dim).repeat(group, axis=1)
        query = q[t0:t1].reshape(t1 - t0, heads, head_dim)  # [T, H, D]
        scores = np.zeros((t1 - t0, heads, length), dtype=F32)
        for d in range(head_dim):
            scores += query[:, :, d, None] * keys[None, :, :, d].transpose(0, 2, 1)
        scores *= scale
        visible = np.arange(length)[None, None, :] <= positions[t0:t1, None, None]
        if window is not None:
            visible &= np.arange(length)[None, None, :] > positions[t0:t1, None, None] - window
        scores = np.where(visible, scores, F32(-np.inf))
        weights = exp32(scores - scores.max(axis=2, keepdims=True))  # masked -> 0
        total = weights[:, :, 0].copy()
        mixed = weights[:, :, 0, None] * values[None, 0]
        for j in range(1, length):
            total += weights[:, :, j]
            mixed += weights[:, :, j, None] * values[None, j]
        out[t0:t1] = (mixed / total[:, :, None]).reshape(t1 - t0, heads * head_dim)
    return RAD_OK
