"""gemm_tma.cu's grouped and SwiGLU entries beside the launches they stand for, issued raw on a stream
(a fake sm_90's or a card's; holds no tests): imported by tests/test_gemm_tma_group.py and
bench/card_grouped_gemm.py. Every launch reads one x's bf16 rows [M, K] (as r4d_narrow_bf16_dev or the
fused norm leaves them); the plain entry runs unsplit, so its sums are in the grouped forms' order."""

import importlib

import ml_dtypes
import numpy as np

from radiance.abi import KernelArgs

PACKAGE = "radiance.plugins.kernels.libr4d"
tc = importlib.import_module(f"{PACKAGE}.device_tensor_cores")
dk = importlib.import_module(f"{PACKAGE}.device_kernels")
prefill = importlib.import_module(f"{PACKAGE}.device_prefill_rows")
Step = importlib.import_module(f"{PACKAGE}.device_rows").Step
MAPS_BYTES = 4 * tc.MAP_BYTES  # x's map and up to three weights'


def bf16_codes(values: np.ndarray) -> np.ndarray:
    """f32 values as bf16 (nearest even, r4d_narrow_bf16_dev's rounding), their u16 codes."""
    return np.ascontiguousarray(values, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def plain_steps(rows: int, maps: int, codes: int, n: int, y: int, m: int, k: int) -> list:
    """r4d_tma_maps then r4d_tma_gemm_bf16 in one split: y [m, n] = x . w^T, w's bf16 codes [n, k]."""
    per = -(-2 * k // tc.TMA_CUT.k_bytes)  # every k-tile in the one split
    mapping = KernelArgs("r4d_tma_maps").pointer(rows).pointer(codes).i32(m).i32(n).i32(2 * k).pointer(maps)
    gemm = (KernelArgs("r4d_tma_gemm_bf16").pointer(maps).pointer(0).pointer(0).i32(0).pointer(y).pointer(0)
            .pointer(0).i32(m).i32(n).i32(k).i32(per))
    grid, block = tc.grid(m, n, 1, "tma")
    return [Step("r4d_tma_maps", "gemm_tma", (1, 1, 1), (32, 1, 1), mapping, 0, tc.options("r4d_tma_maps")),
            Step("r4d_tma_gemm_bf16", "gemm_tma", grid, block, gemm, tc.shared_bytes(m, "tma", "bf16"),
                 tc.options("r4d_tma_gemm_bf16", m))]


def issue(stream, steps) -> None:
    """Each step compiled (the stream's cache) and launched on `stream`, in order."""
    for step in steps:
        kernel = stream.kernel(dk.source(step.source), step.kernel, step.options)
        stream.launch(kernel, step.grid, step.block, step.args.pack(), step.shared)


class Case:
    """One x's bf16 rows and 1..3 bf16 weights on a card (tests' Card), the outputs of the grouped form
    and of the plain entry a weight, and the maps each plan writes. `swiglu`: two weights, gate's then up's."""

    def __init__(self, on_card, x: np.ndarray, weights: list, swiglu: bool = False):
        (self.m, self.k), self.on_card, self.swiglu = x.shape, on_card, swiglu
        self.n = [w.shape[0] for w in weights]
        self.rows = on_card.upload(bf16_codes(x)).data
        self.codes = [on_card.upload(bf16_codes(w)).data for w in weights]
        self.fused = [on_card.upload(np.full((self.m, n), np.nan, np.float32)) for n in self.n]
        self.plain = [on_card.upload(np.full((self.m, n), np.nan, np.float32)) for n in self.n]
        self.maps = [on_card.alloc(MAPS_BYTES, "maps") for _ in range(1 + len(weights))]

    def fused_steps(self) -> list:
        """The maps then the grouped or SwiGLU launch (device_prefill_rows.group_steps, as the fused rows plan it)."""
        return prefill.group_steps(self.rows, self.maps[0], list(zip(self.codes, self.n)), [y.data for y in self.fused],
                                   self.m, self.k, self.swiglu)

    def plain_chain(self) -> list:
        """A maps and GEMM launch a weight (and for SwiGLU r4d_silu_mul_dev on gate's, in place)."""
        steps = []
        for at, (codes, n, y) in enumerate(zip(self.codes, self.n, self.plain)):
            steps += plain_steps(self.rows, self.maps[1 + at], codes, n, y.data, self.m, self.k)
        if self.swiglu:
            multiprocessors = getattr(self.on_card.stream, "multiprocessors", 1)
            steps.append(prefill.silu_mul_step(self.plain[0].data, self.plain[1].data, self.m * self.n[0], multiprocessors))
        return steps

    def read(self, outputs) -> list:
        return [self.on_card.download(y, np.zeros((self.m, n), np.float32)) for y, n in zip(outputs, self.n)]
