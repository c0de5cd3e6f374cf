"""The sample row: the same tokens as libref's for the same inputs, faster.

libref's procedure (docs/OPS.md): greedy at temperature 0 (the first maximum); otherwise
`logits / temperature`, the order of a stable argsort of the negated values (ties by index), the
top_k first, softmax weights `exp(l - max)` in f64 rounded to f32, their running f32 sum, the
shortest prefix reaching `top_p * total`, a Philox draw. The arithmetic below is libref's, on the
same values in the same order; only the ordering is found faster:

- top_k > 0: a partition finds the k-th value; the candidates (every value above it, then the
  lowest-indexed values equal to it) are sorted stably by value. These are exactly the first k of
  the full stable argsort.
- top_k == 0: only the values within 20 of the maximum are ordered (HEAD below), by r4d.c's
  stable radix sort of the negated values' order-preserving bits, or without the native library by
  one unstable sort of unique 64-bit keys, (those bits << 32) | position; both equal the stable
  argsort (-0.0 made +0.0 first, as argsort compares them equal).
- a NaN among the logits: libref's own stable argsort, nothing assumed.
"""

import numpy as np

from radiance.abi import RAD_OK

F32 = np.float32
_SIGN = np.uint32(0x80000000)


def uniform(seed: int, step: int) -> float:
    generator = np.random.Generator(np.random.Philox(key=int(seed), counter=[int(step), 0, 0, 0]))
    return generator.random()


def _exp32(values: np.ndarray) -> np.ndarray:
    return np.exp(np.asarray(values, dtype=np.float64)).astype(F32)


def _stable_descending(values: np.ndarray, indices: np.ndarray, native=None) -> np.ndarray:
    """`indices` (ascending) ordered as np.argsort(-values, kind="stable") orders them: the native
    radix sort, else one unstable sort of unique 64-bit keys, the negated value's order-preserving
    bits above the position."""
    if native is not None:
        values = np.ascontiguousarray(values, dtype=F32)
        positions = np.empty(len(values), np.int64)
        if native.lib.r4d_argsort_desc(values.ctypes.data, len(values), positions.ctypes.data) == 0:
            return indices[positions]
    negated = -values + F32(0.0)  # -0.0 -> +0.0: argsort compares them equal
    bits = negated.view(np.uint32)
    ordered = np.where(bits & _SIGN, ~bits, bits | _SIGN).astype(np.uint64)
    keys = np.sort((ordered << np.uint64(32)) | np.arange(len(values), dtype=np.uint64))
    return indices[(keys & np.uint64(0xFFFFFFFF)).astype(np.intp)]


# Softmax weights exp(l - max) below 2**-25 leave an f32 running sum that starts at exp(0) = 1
# unchanged (less than a quarter of its ulp), so values more than HEAD below the maximum
# (weight <= exp(-20) ~ 2e-9) never move the sums and need no ordering.
HEAD = F32(-20.0)


def draw(logits, temperature: float, top_k: int, top_p: float, seed: int, step: int, native=None) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    scaled = logits / F32(temperature)
    vocab = len(scaled)
    if np.isnan(scaled).any():
        return _draw_sorted(scaled, np.argsort(-scaled, kind="stable"), top_k, top_p, seed, step)
    if 0 < top_k < vocab:
        negated = -scaled
        kth = np.partition(negated, top_k - 1)[top_k - 1]
        better = np.flatnonzero(negated < kth)
        tied = np.flatnonzero(negated == kth)[: top_k - len(better)]
        candidates = np.sort(np.concatenate([better, tied]))
        return _draw_sorted(scaled, candidates[np.argsort(negated[candidates], kind="stable")], 0, top_p, seed, step)
    head = np.flatnonzero((scaled - scaled.max()) >= HEAD)
    if len(head) == 0:  # an infinite maximum: nothing is within HEAD of it; libref's own order
        return _draw_sorted(scaled, np.argsort(-scaled, kind="stable"), 0, top_p, seed, step)
    order = _stable_descending(scaled[head], head, native)
    return _draw_sorted(scaled, order, 0, top_p, seed, step, partial=len(head) < vocab)


def _draw_sorted(scaled, order, top_k, top_p, seed, step, partial=False) -> int:
    """libref's arithmetic on `order` (the stable descending order, or its head when `partial`)."""
    if 0 < top_k < len(order):
        order = order[:top_k]
    kept = scaled[order]
    weights = _exp32(kept - kept[0])
    running = np.cumsum(weights, dtype=F32)  # an in-order scan, as libref's
    if 0 < top_p < 1:
        cut = int(np.searchsorted(running, F32(top_p) * running[-1], side="left")) + 1
        # libref cuts its full order at the same place (past the head the sums do not move), so
        # its order ends here too: the fallback below is this order's last, not the full order's
        order, running, partial = order[:cut], running[:cut], False
    threshold = F32(uniform(seed, step)) * running[-1]
    index = int(np.searchsorted(running, threshold, side="right"))
    if index >= len(order) and partial:
        # no running sum exceeds the threshold: libref takes the last of the full order, the
        # highest index among the smallest values
        return int(np.flatnonzero(scaled == scaled.min())[-1])
    return int(order[min(index, len(order) - 1)])


def sampler(native=None):
    """The sample launch; `native` (r4d.c) lends its radix argsort, numpy sorts without it."""
    def sample(a):
        logits, temperature, top_k, top_p, rng, tokens = (t.data for t in a.t)
        m = int(a.params["M"])
        temps = temperature[:m]
        if m and not (temps > 0).any():
            tokens[:m] = np.argmax(logits[:m], axis=1)
            return RAD_OK
        for row in range(m):
            tokens[row] = draw(logits[row], float(temps[row]), int(top_k[row]), float(top_p[row]),
                               int(rng[row, 0]), int(rng[row, 1]), native)
        return RAD_OK
    return sample
