"""Writing a model: declare every weight, then stream each one row block by row block (quantise or
split, write the planes, decode them back for the error report), so memory is bounded by a row block
per thread, not by the model. Weights are streamed by a pool of threads, one weight per thread at a
time: numpy's generators, casts and sums, zlib and pwrite release the GIL on large arrays, and every
offset is fixed by the declarations, so the file and the report are the same whatever the threads.
The error summary joins the metadata at the end, in header bytes reserved for it."""

import os
import sys
import threading
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from radiance.abi import RAD_PLANE_TABLE
from radiance.weights.container_format import ContainerError
from radiance.weights.container_writer import ContainerWriter
from radiance.weights.planes import plane_nbytes, plane_shape, plane_row_bytes

from .decoding import decode_weight
from .errors import ConvertError
from .job import WeightJob
from .report import WeightError, summary, summary_bytes

# Memory grows by a row block per thread (a whole weight for fp8 and nvfp4); 8 is a guess at where
# pwrite and the disk, not the CPUs, set the pace.
MAX_THREADS = 8


@dataclass
class Model:
    """What a source gives: everything the container holds, the weights still to be produced."""
    source: str                 # the file or folder, as errors name it
    architecture: str
    hyper: dict
    tokenizer: str | None
    chat_template: str | None
    jobs: list[WeightJob]
    metadata: dict = field(default_factory=dict)


def _whole(plane) -> bool:
    """Planes every row block shares: TABLE planes and TILED planes of a whole-extent row block."""
    return plane.kind == RAD_PLANE_TABLE or plane.block_rows == 0


def _check_planes(job: WeightJob, planes: dict, shape: tuple) -> None:
    if sorted(planes) != sorted(p.name for p in job.encoding.planes):
        raise ValueError(f"planes {sorted(planes)} differ from the encoding's "
                         f"{sorted(p.name for p in job.encoding.planes)}")
    for plane in job.encoding.planes:
        data, wanted = planes[plane.name], (plane_shape(plane, shape)[0], plane_row_bytes(plane, shape))
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.shape != wanted:
            found = f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray) else type(data).__name__
            raise ValueError(f"plane {plane.name!r}: {found}, not the raw bytes np.uint8 {list(wanted)} "
                             f"of rows {shape[0]}")


class _Stopped(Exception):
    """An earlier weight failed: this one gives up at its next row block."""


def default_threads() -> int:
    """The CPUs this process may use, at most MAX_THREADS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on this platform (macOS)
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_THREADS))


def _stream(writer, job: WeightJob, quantizers: dict, advance, stopped) -> WeightError:
    rows, cols = job.matrix
    step = job.row_block or rows
    for plane in job.encoding.planes:
        if not _whole(plane) and step % plane.block_rows and step < rows:
            raise ValueError(f"row block {step} splits the {plane.block_rows}-row blocks of plane {plane.name!r}")
    nbytes = sum(plane_nbytes(plane, job.matrix) for plane in job.encoding.planes)
    error, shared = WeightError(job.name, job.method, nbytes), {}
    for r0 in range(0, rows, step):
        if stopped():
            raise _Stopped
        r1 = min(rows, r0 + step)
        planes, source = job.produce(r0, r1)
        _check_planes(job, planes, (r1 - r0, cols))
        for plane in job.encoding.planes:
            data = planes[plane.name]
            if _whole(plane) and plane.name in shared:
                if not np.array_equal(shared[plane.name], data):
                    raise ValueError(f"plane {plane.name!r} covers every row but differs between row "
                                     f"blocks (its quantiser's row_block must be 0)")
                continue
            if _whole(plane):
                shared[plane.name] = data
            writer.write(job.name, plane.name, data)
            advance(data.nbytes)
        error.add(decode_weight(job.encoding, planes, (r1 - r0, cols), quantizers, job.name), source)
    return error


@contextmanager
def _about(model: Model, job: WeightJob):
    """A fault while making a weight: one line naming the source and the weight."""
    try:
        yield
    except ContainerError:
        raise
    except (ValueError, OSError) as error:
        raise ConvertError(model.source, f"weight {job.name!r}: {error}") from None


def _stream_all(writer, model: Model, quantizers: dict, bar, threads: int) -> list[WeightError]:
    """Every weight's error, in the model's order, or the failure of the first weight (in that order)
    that fails, as the sequential writer would raise it: a failure stops the weights after it at
    their next row block and drops those not begun; the weights before it run on, since one of them
    may fail too (the pool starts weights in order, so every one before it has begun)."""
    lock = threading.Lock()
    first_failed = [len(model.jobs)]  # the index of the first weight failed so far

    def advance(nbytes):
        with lock:  # tqdm's count is not thread-safe
            bar.update(nbytes)

    def one(index, job):
        try:
            with _about(model, job):
                return _stream(writer, job, quantizers, advance, lambda: index > first_failed[0])
        except _Stopped:
            raise
        except BaseException:
            with lock:
                first_failed[0] = min(first_failed[0], index)
            raise

    with ThreadPoolExecutor(threads, thread_name_prefix="rad-convert") as pool:
        futures = [pool.submit(one, index, job) for index, job in enumerate(model.jobs)]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:  # Ctrl-C: every weight stops at its next row block
            first_failed[0] = -1
            raise
        finally:
            pool.shutdown(cancel_futures=True)  # waits for the weights running
    for future in futures:
        if not future.cancelled() and not isinstance(future.exception(), _Stopped):
            future.result()  # raises this weight's failure, if it had one
    return [future.result() for future in futures]


def write_model(path, model: Model, quantizers: dict | None = None,
                threads: int | None = None, progress: str | None = None) -> list[WeightError]:
    """Write `model` to the .rad file `path`; nothing is left at `path` (or beside it) on failure.
    `quantizers` ({name: Quantizer}) decode schemes of their own for the error report; `threads`
    weights are streamed at a time (default_threads() when None); `progress` labels the progress
    bar (default: rad-convert PATH)."""
    quantizers = quantizers or {}
    metadata = {**model.metadata, "source": model.source,
                "methods": {job.name: job.method for job in model.jobs}}
    reserve = summary_bytes([job.name for job in model.jobs])
    with ContainerWriter(path, model.architecture, model.hyper, model.tokenizer, model.chat_template,
                         metadata, header_reserve=reserve) as writer:
        sizes = {}
        for job in model.jobs:
            with _about(model, job):
                sizes[job.name] = {plane.name: plane_nbytes(plane, job.matrix) for plane in job.encoding.planes}
            writer.declare(job.name, job.shape, job.encoding, sizes[job.name])
        total = sum(sum(planes.values()) for planes in sizes.values())
        with tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr, disable=None,
                  desc=progress or f"rad-convert {path}") as bar:
            errors = _stream_all(writer, model, quantizers, bar, threads or default_threads())
        writer.update_metadata(summary(errors) if errors else {})
    return errors
