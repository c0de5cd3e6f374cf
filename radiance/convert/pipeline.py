"""Writing a model: declare every weight, then stream each one row block by row block (quantise or
split, write the planes, decode them back for the error report), so memory is bounded by a row block,
not by the model. The error summary joins the metadata at the end, in header bytes reserved for it."""

import sys
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


def _stream(writer, job: WeightJob, quantizers: dict, bar) -> WeightError:
    rows, cols = job.matrix
    step = job.row_block or rows
    for plane in job.encoding.planes:
        if not _whole(plane) and step % plane.block_rows and step < rows:
            raise ValueError(f"row block {step} splits the {plane.block_rows}-row blocks of plane {plane.name!r}")
    nbytes = sum(plane_nbytes(plane, job.matrix) for plane in job.encoding.planes)
    error, shared = WeightError(job.name, job.method, nbytes), {}
    for r0 in range(0, rows, step):
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
            bar.update(data.nbytes)
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


def write_model(path, model: Model, quantizers: dict | None = None) -> list[WeightError]:
    """Write `model` to the .rad file `path`; nothing is left at `path` (or beside it) on failure.
    `quantizers` ({name: Quantizer}) decode schemes of their own for the error report."""
    quantizers = quantizers or {}
    metadata = {**model.metadata, "source": model.source,
                "methods": {job.name: job.method for job in model.jobs}}
    reserve = summary_bytes([job.name for job in model.jobs])
    errors = []
    with ContainerWriter(path, model.architecture, model.hyper, model.tokenizer, model.chat_template,
                         metadata, header_reserve=reserve) as writer:
        sizes = {}
        for job in model.jobs:
            with _about(model, job):
                sizes[job.name] = {plane.name: plane_nbytes(plane, job.matrix) for plane in job.encoding.planes}
            writer.declare(job.name, job.shape, job.encoding, sizes[job.name])
        total = sum(sum(planes.values()) for planes in sizes.values())
        with tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr, disable=None,
                  desc=f"rad-convert {path}") as bar:
            for job in model.jobs:
                with _about(model, job):
                    errors.append(_stream(writer, job, quantizers, bar))
        writer.update_metadata(summary(errors) if errors else {})
    return errors
