"""Where a captured decode step's time goes on the card (imported by bench/card_generate.py --kernels).

Three figures of one in-process rank whose decode graph is captured:
- the graph alone: `replays` launches back to back, card events around them (the card's time a step;
  profile_step takes the median of five such runs);
- the step as the engine runs it (card_generate's ms/token), so the difference is the host's share;
- each kernel of a few replays, by name, from CUPTI through torch.profiler where PyTorch is installed
  (the card machine has it; radiance never imports it): time summed per name, calls per step, and the
  step's span less its kernels' time (the gaps between kernels);
- each kernel also by the step's op that launched it (the graph node's name with its layer numbers as
  '#', its grid): the fused q, k, v, o, gate/up, down and lm head GEMVs apart, each with its weight
  bytes' rate in TB/s: captured without chained launches, each kernel's own time; chained, what each
  adds to the step (its end less the end of the kernel before it).
"""

from __future__ import annotations

import collections
import re
import statistics

# bytes an element of a weight format takes, its scales included (q8_0: 34 bytes a block of 32)
WEIGHT_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_1": 20 / 32, "fp8": 1.0, "fp8_channel": 1.0}


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


def kernel_table(executor, key=(1, 1), replays: int = 5, top: int = 25, first: int = 0, labels=None,
                 span: bool = False) -> dict | None:
    """Kernels by name; with `first`, also the step's first `first` kernels and its last three in
    launch order (one layer's kernels, where every layer is alike), each averaged over the replays;
    with `labels` (one (label, weight bytes or None) a launch of the step, in launch order), also by label
    (`span`: a kernel's share of the step, by_label's)."""
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
    table = {"per_step": len(kernels) / replays, "busy_ms": busy / replays / 1e3, "span_ms": span / replays / 1e3,
             "kernels": {name: {"us_per_step": us / replays, "calls_per_step": calls / replays}
                         for name, (us, calls) in rows}}
    if labels is not None:
        if count * replays != len(kernels) or count != len(labels):
            print(f"    ... no table by op: {len(kernels)} kernels in {replays} replays, {len(labels)} launches captured")
        else:
            table["ops"] = by_label(kernels, labels, replays, span)
    return table


def by_label(kernels: list, labels: list, replays: int, span: bool = False) -> dict:
    """The kernels of `replays` replays (each the step's launches in order) by their launch's label:
    µs a step, calls a step, µs a call and, where the weight bytes are known, TB/s. A kernel's µs are
    its own time, or (`span`, for chained kernels, which overlap) its end less the end of the kernel
    before it in the step (the first: its own time): each kernel waits on the one before, so those
    add up to the step's span and say what each op adds to it."""
    per_label = collections.defaultdict(lambda: [0.0, 0, 0.0])
    for index, event in enumerate(kernels):
        label, nbytes = labels[index % len(labels)]
        if span and index % len(labels):
            us = event.time_range.end - kernels[index - 1].time_range.end
        else:
            us = event.time_range.elapsed_us()
        per_label[label][0] += us
        per_label[label][1] += 1
        per_label[label][2] += nbytes or 0.0
    print("    ... the same kernels by the step's op" + (" (chained: each kernel's end less the end of the one before)"
                                                        if span else " (each kernel's own time)") + ":")
    table = {}
    for label, (us, calls, nbytes) in sorted(per_label.items(), key=lambda item: -item[1][0]):
        rate = nbytes / (us * 1e-6) / 1e12 if nbytes and us else None
        table[label] = {"us_per_step": us / replays, "calls_per_step": calls / replays, "us_each": us / calls,
                        "tb_per_s": rate}
        print(f"      {us / replays:9.1f} us/step  {calls / replays:5.0f}x  {us / calls:8.2f} us each  "
              f"{f'{rate:5.2f} TB/s' if rate else '          '}  {label[:90]}")
    return table


def weight_bytes(geometry: dict) -> float | None:
    """The bytes of the weights a GEMV row reads, from its band's geometry (N or N.1.., K, wdtype)."""
    rows = sum(int(geometry[key]) for key in ("N.1", "N.2", "N.3") if key in geometry) or geometry.get("N")
    fmt = WEIGHT_BYTES.get(str(geometry.get("wdtype", "")))
    if not rows or "K" not in geometry or fmt is None:
        return None
    return float(rows) * int(geometry["K"]) * fmt


def capture_labelled(executor, key) -> list:
    """Capture the step of `key` again (its graph dropped first), noting for each kernel launch in
    order its op's label: '<op> <node name, layer numbers as #> <kernel> grid x,y' and its weight
    bytes. The executor reports each row launch's end through check_status (radiance.engine.running.device)."""
    from radiance.engine.running import device as running

    launches, rows = [], []
    device = executor.device
    launch, check = device.launch, running.check_status

    def noted_launch(kernel, grid, block, *args, **kwargs):
        launches.append((kernel.name, tuple(grid)))
        return launch(kernel, grid, block, *args, **kwargs)

    def noted_check(node_launch, row, status):
        rows.append((len(launches), node_launch))
        return check(node_launch, row, status)
    device.launch, running.check_status = noted_launch, noted_check
    try:
        executor._graphs.pop(key, None)
        executor.run(*key)  # captured again (the shape was seen)
    finally:
        device.launch, running.check_status = launch, check
    labels, start = [], 0
    for end, node_launch in rows:
        node = node_launch.node
        name = re.sub(r"\d+", "#", node.name)
        for kernel, grid in launches[start:end]:
            gemv = kernel.startswith("r4d_gemv")
            labels.append((f"{node.op} {name} {kernel}{' grid ' + ','.join(map(str, grid[:2])) if gemv else ''}",
                           weight_bytes(node_launch.band.geometry) if gemv else None))
        start = end
    return labels


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
    gaps = collections.defaultdict(float)  # by name: the card idle (or, chained, overlapping: < 0) before it
    for index, event in enumerate(kernels):
        per_name[event.name][0] += event.time_range.elapsed_us()
        per_name[event.name][1] += 1
        if index:
            gaps[event.name] += event.time_range.start - kernels[index - 1].time_range.end
    rows = sorted(per_name.items(), key=lambda item: -item[1][0])
    print(f"    ... kernels of {steps} {what}: {len(kernels) / steps:.0f} a step, "
          f"busy {busy / steps / 1e3:.3f} ms a step, span {span / steps / 1e3:.3f} ms "
          f"(kernels overlap under chained launches, so busy can exceed the span; 'before': the mean time from "
          f"the previous kernel's end to its start)")
    for name, (us, calls) in rows[:top]:
        print(f"      {us / steps:9.1f} us/step  {calls / steps:5.0f}x  {us / calls:8.2f} us each  "
              f"{gaps[name] / calls:7.2f} us before  {name[:90]}")
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
        # the captured step alone, five times 50 replays: their median, and all five (the spread within a process)
        times = [graph_ms(executor, key) for _ in range(5)]
        result["graph_ms"] = None if None in times else statistics.median(times)
        if result["graph_ms"] is not None:
            result["graph_ms_all"] = times
            print(f"    ... the captured step alone: {result['graph_ms']:.3f} ms (median of 5 x 50 replays back to back: "
                  + ", ".join(f"{t:.3f}" for t in times) + ")")
        # captured again as it was (labelled), its kernels by name and by op (chained: their ends)
        result["kernels"] = kernel_table(executor, key, labels=capture_labelled(executor, key), span=executor.chain)
        if executor.chain:  # chained kernels overlap: each kernel's own time from a plainly launched capture
            executor.chain = False
            try:
                labels = capture_labelled(executor, key)  # without programmatic launches
                print("    ... the same step captured without chained launches:")
                result["kernels_unchained"] = kernel_table(executor, key, first=12, labels=labels)
                result["graph_unchained_ms"] = graph_ms(executor, key)
                print(f"    ... unchained, the captured step alone: {result['graph_unchained_ms']:.3f} ms")
            finally:
                executor.chain = True
                executor._graphs.pop(key, None)
    except Exception as error:
        print(f"    ... the step's profile failed: {type(error).__name__}: {error}")
    return result
