"""Philox4x64-10 as numpy's `np.random.Philox` draws it, in plain Python: the host mirror of the
device sample row's draw (device/sample.cu). `uniform(seed, step)` equals
`np.random.Generator(np.random.Philox(key=seed, counter=[step, 0, 0, 0])).random()` bit for bit
(tests/test_device_rows_host.py checks it): key (seed, 0), the 256-bit counter incremented before
its first use, the first 64-bit word of the block, `(word >> 11) * 2**-53`."""

MASK = (1 << 64) - 1
M0, M1 = 0xD2E7470EE14C6C93, 0xCA5A826395121157
W0, W1 = 0x9E3779B97F4A7C15, 0xBB67AE8584CAA73B


def philox4x64_10(counter: tuple, key: tuple) -> tuple:
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = ((p1 >> 64) ^ c1 ^ k0) & MASK, p1 & MASK, ((p0 >> 64) ^ c3 ^ k1) & MASK, p0 & MASK
        k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
    return c0, c1, c2, c3


def first_word(seed: int, step: int) -> int:
    value = ((int(step) & MASK) + 1) & ((1 << 256) - 1)  # counter = [step, 0, 0, 0], incremented first
    counter = tuple((value >> (64 * i)) & MASK for i in range(4))
    return philox4x64_10(counter, (int(seed) & MASK, (int(seed) >> 64) & MASK))[0]


def uniform(seed: int, step: int) -> float:
    return (first_word(seed, step) >> 11) * (1.0 / 9007199254740992.0)
