"""How the card benches time a PyTorch peer's calls: warmed on a side stream (outside the capture),
captured in one CUDA graph, the graph replayed; milliseconds per launch, the median of 10 replays.
Imports torch only when called (the card machines have it; radiance never depends on it)."""

import contextlib
import statistics


def torch_or_none() -> tuple:
    """(the torch module, "torch <version>") where it imports, else (None, "no PyTorch (<why>)"): the
    peer a card bench runs beside radiance, or says it could not."""
    try:
        import torch
    except ImportError as error:
        return None, f"no PyTorch ({error})"
    return torch, f"torch {torch.__version__}"


def graph_ms(calls, launches: int, context=None) -> float:
    """`calls()` issues `launches` launches (keeping their outputs, so the graph's pool holds them and
    no copy runs beside each); `context` is entered around the warm-up and the capture (an SDPA
    backend, say)."""
    import torch

    with context if context is not None else contextlib.nullcontext():
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            calls()  # warm, outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            calls()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / launches)
    return statistics.median(times)
