"""Where a captured decode step's time goes on the card (imported by bench/card_generate.py --kernels).

Three figures of one in-process rank whose decode graph is captured:
- the graph alone: `replays` launches back to back, card events around them (the card's time a step);
- the step as the engine runs it (card_generate's ms/token), so the difference is the host's share;
- each kernel of a few replays, by name, from CUPTI through torch.profiler where PyTorch is installed
  (the card machine has it; radiance never imports it): time summed per name, calls per step, and the
  step's span less its kernels' time (the gaps between kernels).
"""

from __future__ import annotations

import collections


def graph_ms(executor, key=(1, 1), replays: int = 50) -> float | None:
    graph = executor._graphs.get(key)
    if graph is None:
        return None
    device, handle = executor.device, executor.stream.handle
    start, end = device.event(), device.event()
    device.launch_graph(graph, handle)  # warm
    device.record(start, handle)
    for _ in range(replays):
        device.launch_graph(graph, handle)
    device.record(end, handle)
    device.synchronize(handle)
    return device.elapsed_ms(start, end) / replays


def kernel_table(executor, key=(1, 1), replays: int = 5, top: int = 25, first: int = 0) -> dict | None:
    """Kernels by name; with `first`, also the step's first `first` kernels and its last three in
    launch order (one layer's kernels, where every layer is alike), each averaged over the replays."""
    graph = executor._graphs.get(key)
    if graph is None:
        return None
    try:
        import torch  # noqa: F401
    except ImportError as error:
        print(f"    ... no kernel table: {error}")
        return None
    device, handle = executor.device, executor.stream.handle

    def replay():
        for _ in range(replays):
            device.launch_graph(graph, handle)
        device.synchronize(handle)

    kernels = card_kernels(replay)
    if not kernels:
        print("    ... no kernel table: CUPTI reported no kernels of the graph")
        return None
    busy, span, rows = tabulate(kernels, replays, top, "graph replays")
    count = len(kernels) // replays
    if first and count * replays == len(kernels):
        order = list(range(min(first, count))) + list(range(max(first, count - 3), count))
        for position in order:
            picks = [kernels[r * count + position] for r in range(replays)]
            gap = [picks[r].time_range.start - kernels[r * count + position - 1].time_range.end
                   for r in range(replays)] if position else [0.0]
            print(f"      #{position:<4} {sum(e.time_range.elapsed_us() for e in picks) / replays:8.2f} us"
                  f"  (gap before {sum(gap) / len(gap):6.2f} us)  {picks[0].name[:80]}")
    return {"per_step": len(kernels) / replays, "busy_ms": busy / replays / 1e3, "span_ms": span / replays / 1e3,
            "kernels": {name: {"us_per_step": us / replays, "calls_per_step": calls / replays}
                        for name, (us, calls) in rows}}


def card_kernels(work) -> list:
    """The card kernels `work()` ran (it must synchronise before it returns), in start order, as
    torch.profiler's CUPTI events: eager launches and graph replays alike."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        work()
    kernels = [event for event in profiler.events() if event.device_type == DeviceType.CUDA]
    return sorted(kernels, key=lambda event: event.time_range.start)


def tabulate(kernels: list, steps: int, top: int, what: str):
    """Print the kernels' time by name, per step of `steps`: (busy µs, span µs, rows by time)."""
    busy = sum(event.time_range.elapsed_us() for event in kernels)
    span = kernels[-1].time_range.end - kernels[0].time_range.start
    per_name = collections.defaultdict(lambda: [0.0, 0])
    for event in kernels:
        per_name[event.name][0] += event.time_range.elapsed_us()
        per_name[event.name][1] += 1
    rows = sorted(per_name.items(), key=lambda item: -item[1][0])
    print(f"    ... kernels of {steps} {what}: {len(kernels) / steps:.0f} a step, "
          f"busy {busy / steps / 1e3:.3f} ms a step, span {span / steps / 1e3:.3f} ms "
          f"(kernels overlap under chained launches, so busy can exceed the span)")
    for name, (us, calls) in rows[:top]:
        print(f"      {us / steps:9.1f} us/step  {calls / steps:5.0f}x  {us / calls:8.2f} us each  {name[:90]}")
    return busy, span, rows


def step_kernels(step, top: int = 15) -> dict:
    """One uncaptured or captured engine step's kernels by name (`step()` runs it and synchronises)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return {}
    kernels = card_kernels(step)
    if not kernels:
        return {}
    busy, span, rows = tabulate(kernels, 1, top, "step")
    return {"busy_ms": busy / 1e3, "span_ms": span / 1e3,
            "kernels": {name: {"us": us, "calls": calls} for name, (us, calls) in rows}}


def profile_step(worker, seqs: int = 1) -> dict:
    """A captured decode step of `seqs` sequences (its graph must exist): the graph alone, its kernels
    chained and, captured again without chained launches, each kernel's own time and the gaps."""
    key = (seqs, seqs)
    executor = getattr(worker, "executor", None)
    if executor is None or not hasattr(executor, "_graphs"):
        return {}
    result = {}
    try:  # a diagnosis: its failure must not lose the figures
        result["graph_ms"] = graph_ms(executor, key)
        if result["graph_ms"] is not None:
            print(f"    ... the captured step alone: {result['graph_ms']:.3f} ms (50 replays back to back)")
        result["kernels"] = kernel_table(executor, key)
        if executor.chain:  # chained kernels overlap: each kernel's own time from a plainly launched capture
            executor.chain = False
            executor._graphs.pop(key, None)
            try:
                executor.run(*key)  # captured again (the shape was seen), without programmatic launches
                print("    ... the same step captured without chained launches:")
                result["kernels_unchained"] = kernel_table(executor, key, first=12)
                result["graph_unchained_ms"] = graph_ms(executor, key)
                print(f"    ... unchained, the captured step alone: {result['graph_unchained_ms']:.3f} ms")
            finally:
                executor.chain = True
                executor._graphs.pop(key, None)
    except Exception as error:
        print(f"    ... the step's profile failed: {type(error).__name__}: {error}")
    return result
