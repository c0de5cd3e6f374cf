"""The engine thread: the one thread that owns the Engine. Every add, cancel and step happens here;
requests arrive through a thread-safe queue, and each request's text goes back to its own asyncio
queue, a step's events for every request through one `loop.call_soon_threadsafe`. The loop steps while there is work and sleeps while there
is none (in the ranks' `idle`, on an Event that a new request sets; a launch's heartbeats are taken
meanwhile).

Text is made here too: tokens are detokenised incrementally and stop strings are looked for as the
text grows, so a stop string ends its sequence in the step that completed it, its blocks freed at
once, and the stop string itself is never sent."""

import asyncio
import queue
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from radiance.abi import RAD_STEP_CONTEXT_LENS, RAD_STEP_IDS
from radiance.generation.engine import Engine
from radiance.generation.output_text import OutputText
from radiance.generation.sequence import SamplingParams, Sequence
from radiance.log import get_logger

from .metrics import Metrics
from .protocol import APIError

log = get_logger("radiance.serving")


@dataclass
class Event:
    """What the engine thread hands a request: new text, and at the end why it ended and the usage."""
    text: str = ""
    tokens: int = 0
    finish: str | None = None
    usage: dict | None = None
    error: APIError | None = None


class Job:
    """One request. Made on the HTTP side; from submit on, only the engine thread touches its
    engine state, and only the asyncio side reads its queue."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, loop: asyncio.AbstractEventLoop,
                 arrival: float | None = None, every_step: bool = False):
        """`every_step`: an event for every step that generated a token, with the usage so far, even
        where the tokens added no text (stream_options.continuous_usage_stats)."""
        self.prompt_ids, self.params, self.loop, self.every_step = prompt_ids, params, loop, every_step
        self.arrival = arrival if arrival is not None else time.perf_counter()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.sequence: Sequence | None = None
        self.cancelled = False  # engine thread: cancelled before or after it was added
        self.ended = False  # asyncio side: the last event was received
        # engine-thread state
        self.output: OutputText | None = None
        self.last_token = None

    def deliver(self, event: Event) -> None:
        """From the engine thread: hand an event to the request's event loop."""
        hand_over(self.loop, [(self, event)])


def hand_over(loop: asyncio.AbstractEventLoop, events: list[tuple[Job, Event]]) -> None:
    """From the engine thread: put each event on its job's queue, in loop's thread, with one wake-up
    of that loop for them all (each call_soon_threadsafe writes the loop's self-pipe, and the HTTP
    thread it wakes takes the GIL from the engine thread: once a step, not once a request)."""

    def put():
        for job, event in events:
            job.queue.put_nowait(event)

    try:
        loop.call_soon_threadsafe(put)
    except RuntimeError:  # the event loop is closed: the server is going down
        pass


@dataclass
class StepShapes:
    """How many steps ran at each (tokens, sequences): which bands of the graph the run issued."""
    counts: Counter = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, tokens: int, seqs: int) -> None:
        with self.lock:
            self.counts[(tokens, seqs)] += 1

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.counts)


class EngineLoop:
    """`run()` is the engine thread's body (the caller's thread: a CLI's main thread, or a thread of
    its own); `submit`, `cancel` and `stop` may be called from any thread."""

    def __init__(self, engine: Engine, ranks, metrics: Metrics):
        self.engine, self.ranks, self.metrics = engine, ranks, metrics  # ranks: launch/ranks.py's Ranks
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.running_jobs: dict[int, Job] = {}
        # a step's events, handed over together once the next step is on its way to the ranks
        self.outbox: list[tuple[Job, Event]] = []
        self._submissions = 0
        self.shapes = StepShapes()
        self.failure: BaseException | None = None
        self.steps = 0
        self._collected = None  # the shape of the step whose result the last engine step took
        self._wrap_steps()
        blocks, scheduler = engine.blocks, engine.scheduler
        metrics.watch(waiting=lambda: len(scheduler.waiting) + self.inbox.qsize(),
                      running=lambda: len(scheduler.running), kv_usage=lambda: blocks.usage,
                      kv_blocks=blocks.num_blocks)

    def _wrap_steps(self) -> None:
        """Count every plan's shape as it goes to the ranks, and note when a step's result came
        (run ahead, a step's plan goes out one engine step before its result comes back)."""
        submit, collect = self.engine.submit, self.engine.collect
        shapes = deque()  # of the steps submitted and not collected, oldest first

        def counted(arrays, feed):
            shapes.append((len(arrays[RAD_STEP_IDS]), len(arrays[RAD_STEP_CONTEXT_LENS])))
            self.shapes.add(*shapes[-1])
            submitted = submit(arrays, feed)
            self._submissions += 1
            # Now, not before the plan: the HTTP thread the hand-over wakes takes the GIL for every
            # request's chunk, and meanwhile the ranks (the card, or the host rows' threads, which
            # run without the GIL) compute this step instead of waiting for its plan.
            self._hand_over()
            return submitted

        def noted():
            tokens = collect()
            self._collected = shapes.popleft()
            return tokens

        self.engine.submit, self.engine.collect = counted, noted

    # ---- any thread -----------------------------------------------------------------------------

    def submit(self, job: Job) -> None:
        if self.stopping.is_set():
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        self.inbox.put(("add", job))
        self.wake.set()

    def cancel(self, job: Job) -> None:
        self.inbox.put(("cancel", job))
        self.wake.set()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    # ---- the engine thread ----------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.wake.clear()  # before looking: a request that comes after sets it again
                self._take_requests()
                if self.engine.scheduler.has_work:
                    self._step()
                else:
                    self._hand_over()  # the last step's events: no next step to wait for
                    self.engine.settle()  # run ahead: a step of ended sequences only, still on the ranks
                    self._collected = None  # no step of a request's: nothing for the step metrics
                    self.ranks.idle(self.wake)
        except BaseException as error:
            self.failure = error
            log.error("the engine stopped: %s: %s", type(error).__name__, error)
            raise
        finally:
            self.stopping.set()
            self._end_all()

    def _take_requests(self) -> None:
        while True:
            try:
                kind, job = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "cancel":
                self._cancel(job)
            elif not job.cancelled:
                self._add(job)

    def _add(self, job: Job) -> None:
        try:
            job.sequence = self.engine.add(job.prompt_ids, job.params)
        except ValueError as error:  # checked at the door already; the scheduler has the last word
            job.deliver(Event(error=APIError(400, str(error), param="prompt", code="context_length_exceeded")))
            return
        job.output = OutputText(self.engine.text, job.params)
        self.running_jobs[job.sequence.id] = job
        self.metrics.prompt_tokens.inc(len(job.prompt_ids))

    def _cancel(self, job: Job) -> None:
        job.cancelled = True
        sequence = job.sequence
        if sequence is not None and not sequence.finished:
            self.engine.cancel(sequence)  # frees its KV blocks now
            self.running_jobs.pop(sequence.id, None)
            self.metrics.finished.labels(reason="cancelled").inc()

    def _step(self) -> None:
        start, submissions = time.perf_counter(), self._submissions
        produced = self.engine.step()
        now = time.perf_counter()
        self.steps += 1
        if self._collected is not None:  # a step came back from the ranks
            (step_tokens, step_seqs), self._collected = self._collected, None
            self.metrics.step.observe(now - start)
            self.metrics.step_tokens.observe(step_tokens)
            self.metrics.step_seqs.observe(step_seqs)
            self.metrics.ranks_report(self.ranks.step_stats())
        tokens = {}
        for sequence, token in produced:
            tokens.setdefault(sequence.id, []).append(token)
        for sequence_id, new in tokens.items():
            job = self.running_jobs.get(sequence_id)
            if job is not None:
                self._advance(job, new, now)
        if self._submissions == submissions:  # no step went out: nothing to wait for
            self._hand_over()

    def _hand_over(self) -> None:
        """The events made since the last hand-over, one wake-up for each event loop the jobs belong
        to (the server has one). Called once the next step has gone to the ranks (or none will)."""
        if not self.outbox:
            return
        by_loop: dict = {}
        for job, event in self.outbox:
            by_loop.setdefault(job.loop, []).append((job, event))
        self.outbox = []
        for loop, events in by_loop.items():
            hand_over(loop, events)

    def _advance(self, job: Job, tokens: list[int], now: float) -> None:
        sequence, output = job.sequence, job.output
        text = []
        for token in tokens:
            if job.last_token is None:
                self.metrics.ttft.observe(now - job.arrival)
            else:
                self.metrics.itl.observe(now - job.last_token)
            job.last_token = now
            text.append(output.push(token))
        self.metrics.generated_tokens.inc(len(tokens))
        if output.stopped:
            if not sequence.finished:
                self.engine.scheduler.finish(sequence, "stop")  # frees its blocks in this step
            self._finish(job, "".join(text), "stop", len(tokens))
        elif sequence.finished:
            self._finish(job, "".join(text) + output.rest(), sequence.finish_reason, len(tokens))
        elif any(text) or job.every_step:  # else nothing to hand over while a character or a stop string is pending
            self.outbox.append((job, Event(text="".join(text), tokens=len(tokens),
                                           usage=self._usage(job) if job.every_step else None)))

    @staticmethod
    def _usage(job: Job) -> dict:
        completion = len(job.sequence.output_ids)
        return {"prompt_tokens": len(job.prompt_ids), "completion_tokens": completion,
                "total_tokens": len(job.prompt_ids) + completion}

    def _finish(self, job: Job, text: str, reason: str, tokens: int) -> None:
        self.running_jobs.pop(job.sequence.id, None)
        self.metrics.finished.labels(reason=reason).inc()
        self.metrics.e2e.observe(time.perf_counter() - job.arrival)
        self.outbox.append((job, Event(text=text, tokens=tokens, finish=reason, usage=self._usage(job))))

    def _end_all(self) -> None:
        """The loop is over (asked to stop, or failed): every request still here gets an error."""
        self._hand_over()  # what a step made before it all ended goes first
        if self.failure is not None:
            error = APIError(500, f"the engine failed: {type(self.failure).__name__}: {self.failure}",
                             type="server_error", code="engine_failed")
        else:
            error = APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        pending = list(self.running_jobs.values())
        while True:
            try:
                kind, job = self.inbox.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                pending.append(job)
        self.running_jobs.clear()
        for job in pending:
            if job.sequence is not None and not job.sequence.finished:
                try:
                    self.engine.cancel(job.sequence)
                except Exception:  # the engine may be what failed; the error below is what matters
                    pass
            job.deliver(Event(error=error))
