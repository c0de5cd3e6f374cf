"""Reference sampling, one token per row. Temperature 0 is greedy (the first maximum). Otherwise:
logits / temperature; keep the top_k largest (0 = all; ties by index); softmax in that sorted
order; keep the shortest prefix whose probability reaches top_p; draw u in [0, 1) from
Philox(key=seed, counter=step) and take the first token whose running sum exceeds u * total."""

import numpy as np

from radiance.abi import RAD_OK, rad_args_geti

from .ordered import F32, exp32


def uniform(seed: int, step: int) -> float:
    generator = np.random.Generator(np.random.Philox(key=int(seed), counter=[int(step), 0, 0, 0]))
    return generator.random()


def draw(logits, temperature, top_k, top_p, seed, step) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    scaled = logits / F32(temperature)
    order = np.argsort(-scaled, kind="stable")
    if 0 < top_k < len(order):
        order = order[:top_k]
    kept = scaled[order]
    weights = exp32(kept - kept[0])
    running = np.cumsum(weights, dtype=F32)  # sequential: np.cumsum is an in-order scan
    if 0 < top_p < 1:
        cut = int(np.searchsorted(running, F32(top_p) * running[-1], side="left")) + 1
        order, running = order[:cut], running[:cut]
    threshold = F32(uniform(seed, step)) * running[-1]
    index = int(np.searchsorted(running, threshold, side="right"))
    return int(order[min(index, len(order) - 1)])


def sample(a):
    logits, temperature, top_k, top_p, rng, tokens = (t.data for t in a.t)
    for row in range(rad_args_geti(a, "M")):
        tokens[row] = draw(logits[row], float(temperature[row]), int(top_k[row]), float(top_p[row]),
                           int(rng[row, 0]), int(rng[row, 1]))
    return RAD_OK
