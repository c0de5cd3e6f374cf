"""The broadcast ring's cost between real processes: a decode plan (generation/step_plan.py's arrays
for one sequence and a feed, as a generation/plan_record.py record) from this process to N reader
processes through one ring, each reader taking it into step inputs as a rank does, a result back
from reader 0 through another, round trip after round trip; what the record's mac costs; and what
one record costs in one process, warm and on caches a decode step has just flushed.

    python bench/ring_latency.py [--readers 1 2 3] [--rounds 2000] [--gap-us 0] [--spin-us 1000]
                                 [--ways python native] [--take-rounds 3]

`--gap-us` makes the reader hold each record that long before answering (a stand-in for a step's
compute, so the writer's wait ends in a sleep and a wake, as it does in a launch)."""

import argparse
import hashlib
import multiprocessing as mp
import secrets
import statistics
import sys
import time

import numpy as np


MAX_BLOCKS = 128


def plan(max_blocks: int = MAX_BLOCKS) -> dict:
    seqs, tokens = 1, 1
    return {"step.ids": np.zeros(tokens, np.int32), "step.positions": np.zeros(tokens, np.int32),
            "step.slots": np.zeros(tokens, np.int32), "step.cu_seqlens": np.zeros(seqs + 1, np.int32),
            "step.context_lens": np.zeros(seqs, np.int32), "step.last_index": np.zeros(seqs, np.int32),
            "step.block_tables": np.zeros((seqs, max_blocks), np.int32),
            "step.temperature": np.zeros(seqs, np.float32), "step.top_k": np.zeros(seqs, np.int32),
            "step.top_p": np.ones(seqs, np.float32), "step.rng": np.zeros((seqs, 2), np.uint64)}


def record_maker():
    """What makes the decode plan's record each round, as the coordinator does (its arrays made once)."""
    from radiance.generation import plan_record
    from radiance.generation.feed import Feed

    arrays, feed = plan(), Feed.of([(0, 0)])
    return lambda: plan_record.encode(arrays, feed)


def taker():
    """A rank's end of the plans: a PlanReader over step inputs of a rank's size, taking whole plans
    (as a rank without micro-batches or stages does)."""
    from radiance.engine.running.step_inputs import StepInputs
    from radiance.generation.plan_record import PlanReader

    return PlanReader(StepInputs(512, 64, MAX_BLOCKS), whole=True)


def reader(run_id, secret, index, rounds, gap_s, spin_s, ready):
    from radiance.collectives.result_record import FIGURES, ResultWriter
    from radiance.collectives.ring import RingReader, RingWriter

    plans = RingReader.attach(run_id, "plans", index, secret, spin_s=spin_s)
    results = RingWriter.create(run_id, "results", 1, 2, 4096, secret) if index == 0 else None
    ready.put(index)
    plans_in, encoder, tokens = taker(), ResultWriter(), np.zeros(1, np.int32)
    figures = dict.fromkeys(FIGURES, 0.0)
    for _ in range(rounds):
        plans_in.write(plans_in.take(plans, timeout=60))
        if gap_s:
            end = time.perf_counter() + gap_s
            while time.perf_counter() < end:
                pass
        if results is not None:
            results.publish(encoder.encode(tokens, figures))
    plans.close()
    if results is not None:
        time.sleep(0.5)
        results.close()


def measure(readers: int, rounds: int, gap_us: float, spin_s: float) -> dict:
    from radiance.collectives.result_record import ResultReader
    from radiance.collectives.ring import RingReader, RingWriter
    from radiance.collectives.shm import new_run_id, unlink_run

    run_id, secret = new_run_id(), secrets.token_bytes(32)
    context = mp.get_context("spawn")
    ready = context.Queue()
    plans = RingWriter.create(run_id, "plans", readers, 4, 65536, secret)
    processes = [context.Process(target=reader, args=(run_id, secret, i, rounds, gap_us * 1e-6, spin_s, ready))
                 for i in range(readers)]
    try:
        for process in processes:
            process.start()
        for _ in processes:
            ready.get(timeout=60)
        results = RingReader.attach(run_id, "results", 0, secret, spin_s=spin_s)
        decoder, trips, record = ResultReader(), [], record_maker()
        for _ in range(rounds):
            start = time.perf_counter()
            plans.publish(record(), timeout=10)
            decoder.decode(results.read(timeout=10))
            trips.append(time.perf_counter() - start - gap_us * 1e-6)
        results.close()
    finally:
        for process in processes:
            process.join(30)
        plans.close()
        unlink_run(run_id)
    trips = trips[rounds // 10:]  # the first ones warm up
    return {"median": statistics.median(trips), "p90": sorted(trips)[int(0.9 * len(trips))]}


def mac_cost(rounds: int = 20000) -> float:
    payload = record_maker()()
    secret = secrets.token_bytes(32)
    start = time.perf_counter()
    for _ in range(rounds):
        hashlib.blake2b(payload, key=secret, digest_size=32).digest()
    return (time.perf_counter() - start) / rounds, len(payload)


def ring_cost(way: str = "python", whole: bool = True, rounds: int = 100,
              evict_bytes: int = 64 << 20) -> tuple[float, float]:
    """Median seconds of one plan through a ring in this process, warm and right after streaming
    `evict_bytes` through the caches (as a decode step streams the model's weights before the ranks
    touch the ring again). `whole`: encode, publish, take and write into the step inputs; else a
    rank's side alone (the plan taken out of the slot: copy, mac, seq; written into the step inputs).
    `way`: the slot copied and checked in Python or in one call of libr4d's r4d_ring.c ("native")."""
    from radiance.abi import host_helpers
    from radiance.collectives.ring import RingReader, RingWriter
    from radiance.collectives.shm import new_run_id, unlink_run

    if way == "native":
        from radiance.plugins.kernels.libr4d import native

        host_helpers.offer("ring_take", native.load().lib.r4d_ring_take_p)
    run_id, secret = new_run_id(), secrets.token_bytes(32)
    writer = RingWriter.create(run_id, "plans", 1, 4, 65536, secret)
    reader = RingReader.attach(run_id, "plans", 0, secret)
    plans_in, evict, record = taker(), np.ones(evict_bytes, np.uint8), record_maker()
    figures = []
    try:
        for cold in (False, True):
            times = []
            for _ in range(rounds):
                if not whole:
                    writer.publish(record())
                if cold:
                    evict.sum()
                start = time.perf_counter()
                if whole:
                    writer.publish(record())
                plans_in.take(reader)  # whole: written into the step inputs as it is taken
                times.append(time.perf_counter() - start)
            figures.append(statistics.median(times))
    finally:
        host_helpers.offer("ring_take", None)
        reader.close()
        writer.close()
        unlink_run(run_id)
    return figures[0], figures[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--gap-us", type=float, default=0.0)
    parser.add_argument("--spin-us", type=float, default=1000.0, help="how long each side spins before sleeping")
    parser.add_argument("--ways", nargs="+", choices=["python", "native"], default=["python", "native"],
                        help="a rank's take alone (below) with the slot copied and checked in Python, in C, or both")
    parser.add_argument("--take-rounds", type=int, default=3, help="times over the --ways, alternated")
    args = parser.parse_args()
    print("a rank's take alone (copy out of the slot, mac, seq; written into step inputs), median us, warm / cold:")
    for _ in range(args.take_rounds):
        for way in args.ways:
            warm, cold = ring_cost(way, whole=False, rounds=200)
            print(f"  {way:>7}: {1e6 * warm:6.1f} / {1e6 * cold:6.1f}", flush=True)
    seconds, size = mac_cost()
    print(f"the record's mac (keyed BLAKE2b) over a {size}-byte decode plan record: {1e6 * seconds:.2f} us")
    warm, cold = ring_cost()
    print(f"one plan through a ring in one process: {1e6 * warm:.1f} us warm, {1e6 * cold:.1f} us after 64 MiB "
          f"streamed through the caches")
    print(f"plan out, result back, {args.rounds} round trips less {args.gap_us:g} us held (us)")
    print(f"{'readers':>8}{'median':>9}{'p90':>9}")
    for readers in args.readers:
        figures = measure(readers, args.rounds, args.gap_us, args.spin_us * 1e-6)
        print(f"{readers:8}{1e6 * figures['median']:9.1f}{1e6 * figures['p90']:9.1f}")


if __name__ == "__main__":
    sys.exit(main())
