"""The tensor-core attention's error against exact softmax attention, for device_attention_tiles.TOLERANCE
and docs/OPS.md: attention_tiles.cu's arithmetic in numpy (q * scale * log2(e), k, v and the weights
rounded to bf16, nearest even; each split's softmax in f32 with exp2; the splits merged in log2 units;
tests/fixtures/r4d_fake_kernels.py's form of it) against float64, max|out - ref| / max|ref| over the
rows of one case, the worst over head_dim 64 and 128, contexts 1 to 8192, 1 to 16 splits and q scaled
1x to 6x (peaked weights). No card: the rounding, not the tensor cores' order of sums, is what moves
the rows. Usage: python bench/attention_tiles_tolerance.py [--rows 8] [--seed 0]"""

import argparse

import ml_dtypes
import numpy as np

LOG2E = 1.4426950408889634
KEYS = 32  # attention_tiles.cu's AT_KT: a split's share of the keys is rounded to it


def bf16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float32)


def kernel_form(q, k, v, scale, splits):
    """q [rows, d] (every row sees all of k, v [keys, d]); the kernel's roundings and split merge."""
    keys = len(k)
    queries, keys_b, values_b = bf16(q * np.float32(scale * LOG2E)), bf16(k), bf16(v)
    chunk = -(-(-(-keys // splits)) // KEYS) * KEYS
    peaks, totals, mixes = [], [], []
    for z in range(splits):
        k0, k1 = z * chunk, min(keys, (z + 1) * chunk)
        if k0 >= k1:
            continue
        score = (queries @ keys_b[k0:k1].T).astype(np.float32)
        peak = score.max(axis=1)
        weights = np.exp2(score - peak[:, None]).astype(np.float32)
        peaks.append(peak)
        totals.append(weights.sum(axis=1, dtype=np.float32))
        mixes.append((bf16(weights) @ values_b[k0:k1]).astype(np.float32))
    top = np.max(peaks, axis=0)
    mixed, total = np.zeros_like(mixes[0]), np.zeros_like(totals[0])
    for peak, part, whole in zip(peaks, totals, mixes):
        w = np.exp2(peak - top).astype(np.float32)
        mixed += whole * w[:, None]
        total += part * w
    return mixed / total[:, None]


def exact(q, k, v, scale):
    score = q.astype(np.float64) @ k.astype(np.float64).T * scale
    weights = np.exp(score - score.max(axis=1, keepdims=True))
    return weights @ v.astype(np.float64) / weights.sum(axis=1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    worst = (0.0, None)
    print("head_dim  context  q_scale  splits  error")
    for d in (64, 128):
        for context in (1, 7, 100, 1000, 4096, 8192):
            k = rng.standard_normal((context, d)).astype(np.float32)
            v = rng.standard_normal((context, d)).astype(np.float32)
            for q_scale in (1.0, 3.0, 6.0):
                q = (rng.standard_normal((args.rows, d)) * q_scale).astype(np.float32)
                ref = exact(q, k, v, 1.0 / np.sqrt(d))
                for splits in (1, 4, 16):
                    got = kernel_form(q, k, v, 1.0 / np.sqrt(d), splits)
                    error = float(np.abs(got - ref).max() / np.abs(ref).max())
                    print(f"{d:8d} {context:8d} {q_scale:8.1f} {splits:7d}  {error:.2e}")
                    if error > worst[0]:
                        worst = (error, (d, context, q_scale, splits))
    print(f"worst {worst[0]:.2e} at (head_dim, context, q_scale, splits) = {worst[1]}")


if __name__ == "__main__":
    main()
