"""The PyTorch peer of card_generate.py: gpt-fast's recipe on the same Llama shape (issue 12).

    python3 bench/torch_peer.py [--eight-b] [--small] [--context 512] [--tokens 32] [--batch 1]
        [--modes eager-graph compiled-graph] [--compile-mode max-autotune-no-cudagraphs]
    python3 bench/torch_peer.py --prefill 2048 [--modes ...]   # one prompt's prefill instead of decode
    python3 bench/torch_peer.py --check          # CPU: the cached decode step against a naive recomputation

A gpt-fast-style Llama decoder written here in plain PyTorch (static bf16 KV cache updated with
index_copy_, RMSNorm, rotary embedding in the Hugging Face halves convention, grouped-query attention,
SwiGLU, untied lm head, greedy argmax) with random bf16 weights (seeded randn * 0.02) prefills its
cache to --context positions, then decodes one token per step, the step taking its token and position
as device tensors that it advances in place, so that one captured CUDA graph replays token after
token. "eager-graph" captures the eager step; "compiled-graph" is gpt-fast's recipe: inductor with
coordinate-descent tuning, unique kernel names and the FX graph cache, the step compiled with
torch.compile(mode="max-autotune-no-cudagraphs", fullgraph=True) under the math SDPA backend (as
gpt-fast decodes), then captured into one CUDA graph here. Each mode reports the median and minimum
ms/token over --tokens replays timed with CUDA events (after warm-up; the token is read back to the
host after each, as a streaming generator does), the wall time per token, the memory bound (the bytes
of every weight but the embedding table / 4.8 TB/s, as card_generate.py counts it), the CUDA kernels
one step launches (counted two ways: a profiled un-graphed step, and the kernel nodes of the captured
graph), the compile time and the versions. --batch B decodes B sequences of the same context at
once (tokens_per_s = B / the step's time: the peer of bench/card_batches.py's batched decode).
--prefill N times instead the forward of one N-token prompt (logits of its last position only, as
an engine's prefill samples one token): "compiled-graph" is that forward under torch.compile
(--compile-mode, not captured: a prefill is a few large kernels), "eager-graph" the eager forward;
the median of 5 after two first calls, CUDA events. PyTorch and Triton are never a dependency of
radiance; this script imports no radiance code and needs nothing but PyTorch. Writes
$OUT/torch_peer.json."""

import argparse
import contextlib
import ctypes
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HBM_BYTES_PER_S = 4.8e12  # the figure card_generate.py divides by
EIGHT_B = dict(hidden=4096, layers=32, heads=32, kv_heads=8, ffn=14336, vocab=128256, rope_theta=500000.0)  # card_generate's
SMALL = dict(hidden=512, layers=4, heads=8, kv_heads=2, ffn=1024, vocab=4096, rope_theta=10000.0)
TINY = dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=96, vocab=97, rope_theta=10000.0)
MODES = ("eager-graph", "compiled-graph")
COMPILE_MODE = "max-autotune-no-cudagraphs"
PRE_CAPTURE_STEPS = 8  # steps run before the capture (first calls, profiling, side-stream warm-up) at most


# ---------------------------------------------------------------------------------------------- the model

def random_weight(rows, columns, generator, device, dtype):
    weight = torch.randn(rows, columns, generator=generator, device=device, dtype=dtype).mul_(0.02)
    return torch.nn.Parameter(weight, requires_grad=False)


def ones_weight(size, device, dtype):
    return torch.nn.Parameter(torch.ones(size, device=device, dtype=dtype), requires_grad=False)


def rms_norm(x, weight, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


def rotary_tables(head_dim, positions, theta, device):
    """cos and sin [positions, head_dim], float32, each frequency twice (the halves convention)."""
    inverse_frequencies = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(positions, dtype=torch.float64), inverse_frequencies)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def rotate(x, cos, sin):
    """x [batch, heads, tokens, head_dim]; element i pairs with i + head_dim / 2 (Hugging Face)."""
    x32 = x.float()
    first, second = x32.chunk(2, dim=-1)
    return (x32 * cos + torch.cat([-second, first], dim=-1) * sin).type_as(x)


def grouped_attention(queries, keys, values, mask):
    """Grouped-query attention without copying the cache: the query heads that share a KV head are
    laid along the query axis of that KV head. queries [B, H, T, D]; keys, values [B, KV, S, D];
    mask [T, S] (True: attend). Query head h reads KV head h // (H / KV), as repeat_interleave does."""
    batch, heads, tokens, head_dim = queries.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    grouped = queries.reshape(batch, kv_heads, group * tokens, head_dim)  # row g * T + t
    out = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=mask.repeat(group, 1)[None, None])
    return out.reshape(batch, heads, tokens, head_dim)


class Layer(torch.nn.Module):
    def __init__(self, shape, batch, max_sequence, generator, device, dtype):
        super().__init__()
        hidden, heads, kv_heads = shape["hidden"], shape["heads"], shape["kv_heads"]
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim_of(shape)
        self.eps = shape.get("norm_eps", 1e-5)
        self.attention_norm = ones_weight(hidden, device, dtype)
        self.wqkv = random_weight((heads + 2 * kv_heads) * self.head_dim, hidden, generator, device, dtype)
        self.wo = random_weight(hidden, heads * self.head_dim, generator, device, dtype)
        self.ffn_norm = ones_weight(hidden, device, dtype)
        self.w1 = random_weight(shape["ffn"], hidden, generator, device, dtype)  # gate
        self.w3 = random_weight(shape["ffn"], hidden, generator, device, dtype)  # up
        self.w2 = random_weight(hidden, shape["ffn"], generator, device, dtype)  # down
        cache_shape = (batch, kv_heads, max_sequence, self.head_dim)
        self.register_buffer("keys", torch.zeros(cache_shape, device=device, dtype=dtype), persistent=False)
        self.register_buffer("values", torch.zeros(cache_shape, device=device, dtype=dtype), persistent=False)

    def forward(self, x, positions, mask, cos, sin):
        x = x + self.attention(rms_norm(x, self.attention_norm, self.eps), positions, mask, cos, sin)
        return x + self.feed_forward(rms_norm(x, self.ffn_norm, self.eps))

    def attention(self, x, positions, mask, cos, sin):
        batch, tokens, _ = x.shape
        query_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        queries, keys, values = F.linear(x, self.wqkv).split([query_width, kv_width, kv_width], dim=-1)
        queries = rotate(queries.view(batch, tokens, self.heads, self.head_dim).transpose(1, 2), cos, sin)
        keys = rotate(keys.view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        values = values.view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        self.keys.index_copy_(2, positions, keys)
        self.values.index_copy_(2, positions, values)
        out = grouped_attention(queries, self.keys, self.values, mask)
        return F.linear(out.transpose(1, 2).reshape(batch, tokens, query_width), self.wo)

    def feed_forward(self, x):
        return F.linear(F.silu(F.linear(x, self.w1)) * F.linear(x, self.w3), self.w2)


class Decoder(torch.nn.Module):
    """A Llama decoder with a static KV cache of max_sequence positions per sequence of the batch."""

    def __init__(self, shape, max_sequence, device, dtype=torch.bfloat16, batch=1, seed=0):
        super().__init__()
        check_shape(shape)
        generator = torch.Generator(device=device).manual_seed(seed)
        self.eps = shape.get("norm_eps", 1e-5)
        self.embedding = random_weight(shape["vocab"], shape["hidden"], generator, device, dtype)
        self.layers = torch.nn.ModuleList(Layer(shape, batch, max_sequence, generator, device, dtype)
                                          for _ in range(shape["layers"]))
        self.norm = ones_weight(shape["hidden"], device, dtype)
        self.output = random_weight(shape["vocab"], shape["hidden"], generator, device, dtype)
        cos, sin = rotary_tables(head_dim_of(shape), max_sequence, float(shape["rope_theta"]), device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.register_buffer("slots", torch.arange(max_sequence, device=device), persistent=False)

    def forward(self, tokens, positions):
        """tokens [B, T] int64 at positions [T] int64 (the same for every sequence) -> logits [B, T, V]."""
        return F.linear(rms_norm(self.hidden(tokens, positions), self.norm, self.eps), self.output)

    def hidden(self, tokens, positions):
        """The last layer's output [B, T, hidden], the cache written at `positions`."""
        x = F.embedding(tokens, self.embedding)
        mask = self.slots[None, :] <= positions[:, None]  # [T, S]: a position sees itself and before
        cos, sin = self.cos[positions], self.sin[positions]
        for layer in self.layers:
            x = layer(x, positions, mask, cos, sin)
        return x

    def last_logits(self, tokens, positions):
        """Logits [B, 1, V] of the last position only (a prefill that samples one token)."""
        return F.linear(rms_norm(self.hidden(tokens, positions)[:, -1:], self.norm, self.eps), self.output)

    def weight_bytes(self):
        """The bytes one decode step reads of the weights: all of them but the embedding table."""
        return sum(p.numel() * p.element_size() for name, p in self.named_parameters() if name != "embedding")

    def cache_bytes(self):
        return sum(b.numel() * b.element_size() for name, b in self.named_buffers() if name.endswith(("keys", "values")))


def decode_step(model, token, position):
    """One greedy decode step in place: token [B, 1] at position [1] -> logits [B, 1, V]; afterwards
    token holds the argmax and position the next position, so a captured graph can be replayed again."""
    logits = model(token, position)
    token.copy_(logits[:, -1].argmax(dim=-1, keepdim=True))
    position.add_(1)
    return logits


def head_dim_of(shape):
    return shape.get("head_dim", shape["hidden"] // shape["heads"])


def check_shape(shape):
    missing = [key for key in ("hidden", "layers", "heads", "kv_heads", "ffn", "vocab", "rope_theta") if key not in shape]
    if missing:
        raise ValueError(f"shape lacks {', '.join(missing)}")
    if shape["heads"] % shape["kv_heads"] or head_dim_of(shape) % 2:
        raise ValueError(f"heads {shape['heads']} must be a multiple of kv_heads {shape['kv_heads']} "
                         f"and the head dimension {head_dim_of(shape)} even")


# ------------------------------------------------------------------------------------------ measuring

def measure(shape: dict, context: int = 512, tokens: int = 32, mode: str = "compiled-graph", *,
            warmup: int = 5, compile_mode: str = COMPILE_MODE, seed: int = 0, batch: int = 1) -> dict:
    """Decode ms/token of one mode on the current CUDA device; prints one line and returns a dict:
    ms_per_token (median, CUDA events), min_ms, wall_ms_per_token, generated (the greedy ids),
    bound_ms, weight_bytes, kv_cache_bytes, kernels_per_step, profiled (kernels, launches, copies,
    sets of one un-graphed step), graph_nodes (the captured graph's nodes by type), compile_seconds
    (the first two calls: compile and autotune), compile_mode, notes, torch, cuda, triton, device,
    and mode, shape, context, tokens, max_sequence, batch, tokens_per_s (batch tokens a step)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    if not torch.cuda.is_available():
        raise RuntimeError("measure needs a CUDA device (torch.cuda.is_available() is False)")
    device = torch.device("cuda")
    notes = []
    max_sequence = round_up(context + max(PRE_CAPTURE_STEPS, warmup + tokens) + 1, 64)
    with torch.no_grad():
        model = Decoder(shape, max_sequence, device, seed=seed, batch=batch)
        token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        position = torch.tensor([context], dtype=torch.long, device=device)
        prefill(model, context, seed)
        print(f"{mode:15} ... {model.weight_bytes() / 1e9:.2f} GB of weights, {context} positions prefilled; "
              f"{'compiling (' + compile_mode + ')' if mode == 'compiled-graph' else 'first calls'}", flush=True)
        if mode == "compiled-graph":
            notes += configure_inductor()
            step = torch.compile(lambda t, p: decode_step(model, t, p), mode=compile_mode, fullgraph=True)
            backend, note = math_attention()  # gpt-fast decodes under the math SDPA backend
            notes += note
        else:
            step, backend = (lambda t, p: decode_step(model, t, p)), contextlib.nullcontext()
        with backend:
            compile_seconds = first_calls(step, token, position)
            launches = profiled_launches(step, token, position)
            graph, _ = capture(step, token, position)
        nodes = graph_nodes(graph)
        position.fill_(context)
        timing = replay(graph, token, warmup, tokens)
    notes += [entry["note"] for entry in (launches, nodes) if "note" in entry]
    result = dict(mode=mode, shape=dict(shape), context=context, tokens=tokens, max_sequence=max_sequence,
                  batch=batch, tokens_per_s=batch * 1e3 / timing["ms_per_token"], **timing,
                  bound_ms=1e3 * model.weight_bytes() / HBM_BYTES_PER_S,
                  weight_bytes=model.weight_bytes(), kv_cache_bytes=model.cache_bytes(),
                  kernels_per_step=launches.get("kernels") or nodes.get("kernels") or launches.get("launches"),
                  profiled=launches, graph_nodes=nodes, compile_seconds=compile_seconds,
                  compile_mode=compile_mode if mode == "compiled-graph" else None, notes=notes, **versions())
    print(line(result), flush=True)
    del graph, step, model
    release(mode)
    return result


def measure_prefill(shape: dict, length: int = 2048, mode: str = "compiled-graph", *, runs: int = 5,
                    compile_mode: str = COMPILE_MODE, seed: int = 0) -> dict:
    """One `length`-token prompt's forward (the last position's logits) on the current CUDA device:
    ms (median of `runs`, CUDA events, after two first calls), min_ms, tokens_per_s, compile_seconds,
    notes and the versions; prints one line."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    if not torch.cuda.is_available():
        raise RuntimeError("measure_prefill needs a CUDA device (torch.cuda.is_available() is False)")
    device, notes = torch.device("cuda"), []
    with torch.no_grad():
        model = Decoder(shape, round_up(length, 64), device, seed=seed)
        generator = torch.Generator(device="cpu").manual_seed(seed + 1)
        prompt = torch.randint(shape["vocab"], (1, length), generator=generator).to(device)
        positions = torch.arange(length, device=device)
        forward = model.last_logits
        if mode == "compiled-graph":
            notes += configure_inductor()
            forward = torch.compile(model.last_logits, mode=compile_mode, fullgraph=True)
        start = time.perf_counter()
        for _ in range(2):
            forward(prompt, positions)
        torch.cuda.synchronize()
        compile_seconds = time.perf_counter() - start
        milliseconds = []
        for _ in range(runs):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            forward(prompt, positions)
            end.record()
            end.synchronize()
            milliseconds.append(begin.elapsed_time(end))
    ms = statistics.median(milliseconds)
    result = dict(mode=mode, shape=dict(shape), prefill=length, ms=ms, min_ms=min(milliseconds),
                  tokens_per_s=length * 1e3 / ms, compile_seconds=compile_seconds,
                  compile_mode=compile_mode if mode == "compiled-graph" else None, notes=notes, **versions())
    print(f"{mode:15} prefill {length} tokens: {ms:.2f} ms (min {min(milliseconds):.2f}), {result['tokens_per_s']:.0f} "
          f"tokens/s  compile {compile_seconds:.1f} s  [{result['device']}, torch {result['torch']}]", flush=True)
    del forward, model
    release(mode)
    return result


def prefill(model, context, seed):
    """The cache filled at positions [0, context) from random tokens, in one eager forward."""
    if context <= 0:
        return
    generator = torch.Generator(device="cpu").manual_seed(seed + 1)
    vocab = model.embedding.shape[0]
    prompt = torch.randint(vocab, (model.layers[0].keys.shape[0], context), generator=generator).to(model.slots.device)
    model(prompt, torch.arange(context, device=model.slots.device))
    torch.cuda.synchronize()


def configure_inductor():
    """gpt-fast's inductor settings; a setting this torch lacks is noted, not fatal."""
    import torch._inductor.config as config

    notes = []
    for owner, name in ((config, "coordinate_descent_tuning"), (config.triton, "unique_kernel_names"),
                        (config, "fx_graph_cache")):
        try:
            setattr(owner, name, True)
        except (AttributeError, KeyError) as error:
            notes.append(f"inductor has no {name} ({error})")
    return notes


def math_attention():
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.MATH), []
    except (ImportError, AttributeError) as error:
        return contextlib.nullcontext(), [f"no sdpa_kernel: attention on the default backend ({error})"]


def first_calls(step, token, position):
    """Run the step twice (compiling and autotuning when it is compiled); the seconds this took."""
    start = time.perf_counter()
    for _ in range(2):
        step(token, position)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def capture(step, token, position):
    """Warm the step on a side stream, then capture one call of it into one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step(token, position)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)  # kept: its nodes are counted
    except TypeError:
        graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = step(token, position)
    if hasattr(graph, "instantiate"):
        graph.instantiate()
    return graph, logits


def replay(graph, token, warmup, tokens):
    """Replay warmup, then tokens times, each timed with CUDA events and its token read to the host."""
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    events, walls, ids = [], [], []
    for _ in range(tokens):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began = time.perf_counter()
        start.record()
        graph.replay()
        end.record()
        ids.append(token[0, 0].item())  # the first sequence's token, read as a streaming server reads
        walls.append(time.perf_counter() - began)
        events.append((start, end))
    torch.cuda.synchronize()
    milliseconds = [start.elapsed_time(end) for start, end in events]
    return dict(ms_per_token=statistics.median(milliseconds), min_ms=min(milliseconds),
                wall_ms_per_token=1e3 * statistics.median(walls), generated=ids)


def release(mode):
    if mode == "compiled-graph":
        torch._dynamo.reset()
    import gc

    gc.collect()
    torch.cuda.empty_cache()


# -------------------------------------------------------------------------------- counting the kernels

def profiled_launches(step, token, position):
    """The kernels of one un-graphed step under torch.profiler: the trace's kernel events (CUPTI),
    its kernel launch calls, and its copies and sets. A profiler that fails gives a note."""
    try:
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            step(token, position)
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "trace.json")
            profiler.export_chrome_trace(path)
            events = json.loads(Path(path).read_text()).get("traceEvents", [])
    except Exception as error:  # noqa: BLE001  (the profiler is optional here)
        return {"note": f"torch.profiler failed: {type(error).__name__}: {error}"}
    categories = [str(event.get("cat", "")).lower() for event in events]
    counts = dict(kernels=categories.count("kernel"),
                  launches=sum(1 for event, category in zip(events, categories)
                               if category in ("cuda_runtime", "cuda_driver") and "LaunchKernel" in str(event.get("name"))),
                  copies=categories.count("gpu_memcpy"), sets=categories.count("gpu_memset"))
    if not counts["kernels"]:
        counts["note"] = "the profiler saw no kernel events (CUPTI activity missing?): kernels_per_step counts launch calls"
    return counts


NODE_TYPES = {0: "kernels", 1: "copies", 2: "sets", 3: "host", 4: "child_graphs", 5: "empty", 6: "event_waits",
              7: "event_records", 10: "allocations", 11: "frees", 13: "conditionals"}


def graph_nodes(graph):
    """The captured graph's nodes by type, through the driver (cuGraphGetNodes, cuGraphNodeGetType);
    child graphs are walked into. Needs CUDAGraph(keep_graph=True) and raw_cuda_graph (recent torch)."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        counts = {}
        count_nodes(driver, ctypes.c_void_p(graph.raw_cuda_graph()), counts)
        return counts
    except Exception as error:  # noqa: BLE001  (counting is a cross-check, never fatal)
        return {"note": f"graph nodes not counted: {type(error).__name__}: {error}"}


def count_nodes(driver, handle, counts):
    number = ctypes.c_size_t(0)
    driven(driver.cuGraphGetNodes(handle, None, ctypes.byref(number)), "cuGraphGetNodes")
    nodes = (ctypes.c_void_p * number.value)()
    driven(driver.cuGraphGetNodes(handle, nodes, ctypes.byref(number)), "cuGraphGetNodes")
    for node in nodes[:number.value]:
        kind = ctypes.c_int(-1)
        driven(driver.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)), "cuGraphNodeGetType")
        name = NODE_TYPES.get(kind.value, f"type_{kind.value}")
        counts[name] = counts.get(name, 0) + 1
        if kind.value == 4:
            child = ctypes.c_void_p()
            driven(driver.cuGraphChildGraphNodeGetGraph(ctypes.c_void_p(node), ctypes.byref(child)),
                   "cuGraphChildGraphNodeGetGraph")
            count_nodes(driver, child, counts)


def driven(status, call):
    if status != 0:
        raise RuntimeError(f"{call} returned CUresult {status}")


# ------------------------------------------------------------------------------------------ reporting

def versions():
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # noqa: BLE001
        triton_version = None
    return dict(torch=torch.__version__, cuda=torch.version.cuda, triton=triton_version,
                device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")


def line(result):
    nodes = result["graph_nodes"].get("kernels", "?")
    return (f"{result['mode']:15} {result['ms_per_token']:8.3f} ms/token (min {result['min_ms']:.3f}, wall "
            f"{result['wall_ms_per_token']:.3f})  bound {result['bound_ms']:.3f} ms "
            f"({result['bound_ms'] / result['ms_per_token']:.0%} of it)  kernels/step {result['kernels_per_step']} "
            f"(graph {nodes})  compile {result['compile_seconds']:.1f} s  [{result['device']}, torch "
            f"{result['torch']}, triton {result['triton']}]")


def table(name, runs):
    print(f"\n{name}")
    print(f"  {'mode':15} {'ms/token':>9} {'min':>8} {'wall':>8} {'bound':>7} {'kernels':>8} {'graph':>6} {'compile s':>10}")
    for mode, run in runs.items():
        if "error" in run:
            print(f"  {mode:15} failed: {run['error']}")
            continue
        print(f"  {mode:15} {run['ms_per_token']:9.3f} {run['min_ms']:8.3f} {run['wall_ms_per_token']:8.3f} "
              f"{run['bound_ms']:7.3f} {str(run['kernels_per_step']):>8} {str(run['graph_nodes'].get('kernels', '?')):>6} "
              f"{run['compile_seconds']:10.1f}")
        for note in run["notes"]:
            print(f"  {'':15} note: {note}")


def round_up(value, multiple):
    return -(-value // multiple) * multiple


# ------------------------------------------------------------------------------------------- checking

def reference_logits(model, tokens, theta):
    """Logits [B, N, V] of the whole sequence recomputed without a cache, in float32, written apart
    from the model's own path: rope by complex rotation, GQA by repeat_interleave, explicit softmax."""
    batch, count = tokens.shape
    head_dim = model.layers[0].head_dim
    x = model.embedding[tokens].float()
    positions = torch.arange(count, dtype=torch.float64)
    causal = torch.ones(count, count, dtype=torch.bool).tril()
    for layer in model.layers:
        h = naive_norm(x, layer.attention_norm, layer.eps)
        qkv = h @ layer.wqkv.float().T
        queries, keys, values = qkv.split([layer.heads * head_dim, layer.kv_heads * head_dim, layer.kv_heads * head_dim], -1)
        queries = queries.view(batch, count, layer.heads, head_dim).transpose(1, 2)
        keys = keys.view(batch, count, layer.kv_heads, head_dim).transpose(1, 2)
        values = values.view(batch, count, layer.kv_heads, head_dim).transpose(1, 2)
        queries, keys = complex_rope(queries, positions, theta), complex_rope(keys, positions, theta)
        group = layer.heads // layer.kv_heads
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        scores = (queries @ keys.transpose(-1, -2)) / math.sqrt(head_dim)
        weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        attended = (weights @ values).transpose(1, 2).reshape(batch, count, -1)
        x = x + attended @ layer.wo.float().T
        h = naive_norm(x, layer.ffn_norm, layer.eps)
        gate, up = h @ layer.w1.float().T, h @ layer.w3.float().T
        x = x + (gate * torch.sigmoid(gate) * up) @ layer.w2.float().T
    return naive_norm(x, model.norm, model.eps) @ model.output.float().T


def naive_norm(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight.float()


def complex_rope(x, positions, theta):
    half = x.shape[-1] // 2
    frequencies = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[-1])
    rotation = torch.polar(torch.ones(len(positions), half, dtype=torch.float64), torch.outer(positions, frequencies))
    rotated = torch.complex(x[..., :half].double(), x[..., half:].double()) * rotation
    return torch.cat([rotated.real, rotated.imag], dim=-1).float()


def check(shape=TINY, prompt=5, steps=7, seed=0):
    """On the CPU in float32: prefill prompt tokens, then decode steps teacher-forced tokens through
    decode_step, eager and traced by torch.compile (aot_eager, fullgraph), against reference_logits.
    The cache starts as noise so that a mask letting a future slot through shows. Returns the errors."""
    torch.manual_seed(seed)
    total = prompt + steps
    model = Decoder(shape, max_sequence=round_up(total + 3, 8), device="cpu", dtype=torch.float32, batch=2, seed=seed)
    sequence = torch.randint(shape["vocab"], (2, total))
    with torch.no_grad():
        expected = reference_logits(model, sequence, float(shape["rope_theta"]))
        errors = {}
        eager = lambda t, p: decode_step(model, t, p)  # noqa: E731
        for label, step in (("eager", eager), ("compiled", torch.compile(eager, backend="aot_eager", fullgraph=True))):
            for layer in model.layers:
                layer.keys.normal_()
                layer.values.normal_()
            logits = [model(sequence[:, :prompt], torch.arange(prompt))]
            position = torch.tensor([prompt])
            for index in range(prompt, total):
                token = sequence[:, index:index + 1].clone()
                logits.append(step(token, position).clone())
                if not torch.equal(token[:, 0], logits[-1][:, -1].argmax(-1)) or int(position) != index + 1:
                    raise AssertionError(f"{label}: the step did not advance its token and position at {index}")
            got = torch.cat(logits, dim=1)
            errors[label] = float(((got - expected).abs().amax(-1) / expected.abs().amax(-1)).max())
            print(f"check {label:8}: {total} positions ({prompt} prefilled, {steps} decoded), batch 2, "
                  f"max relative error {errors[label]:.2e} against the uncached float32 recomputation", flush=True)
    return errors


# ----------------------------------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eight-b", action="store_true", help="the Llama-3-8B shape (the default)")
    parser.add_argument("--small", action="store_true", help="a small shape, for a quick look")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--compile-mode", default=COMPILE_MODE, help="torch.compile's mode for compiled-graph")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded at once, each at --context")
    parser.add_argument("--prefill", type=int, default=0, help="time one prompt of this many tokens instead of decode")
    parser.add_argument("--check", action="store_true", help="only the CPU check of the decode step's math")
    args = parser.parse_args()
    if args.check:
        errors = check()
        return 0 if max(errors.values()) < 1e-4 else 1
    shapes = ({"small": SMALL} if args.small else {}) | ({"llama8b": EIGHT_B} if args.eight_b or not args.small else {})
    results = {}
    for name, shape in shapes.items():
        runs = {}
        for mode in args.modes:
            try:
                runs[mode] = measure_prefill(shape, args.prefill, mode, compile_mode=args.compile_mode) if args.prefill \
                    else measure(shape, args.context, args.tokens, mode, warmup=args.warmup,
                                 compile_mode=args.compile_mode, batch=args.batch)
            except Exception as error:  # noqa: BLE001  (one mode failing still reports the other)
                runs[mode] = {"error": f"{type(error).__name__}: {error}"}
                print(f"{mode:15} failed: {runs[mode]['error']}", flush=True)
        if not args.prefill:
            table(f"{name} {shape}, bf16, batch {args.batch}, context {args.context}, {args.tokens} tokens", runs)
        results[name] = runs
    out = os.environ.get("OUT")
    if out:
        Path(out, "torch_peer.json").write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in run for runs in results.values() for run in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
