"""The reader maps, it does not read: a 2 GiB sparse container opens and serves a slice in little memory."""

import os

import numpy as np
import psutil
import pytest

from radiance.weights.container_format import encode_header, plan_layout, weight_json
from radiance.weights.container_reader import Container

from container_samples import q4_1

ROWS, COLS = 1 << 16, 1 << 16  # codes alone: 2 GiB of u4
MiB = 1 << 20


def sparse_container(path):
    """A Q4_1 weight of ROWS x COLS whose data is a hole in the file: only the header is written."""
    planes = {"codes": ROWS * COLS // 2, "scale": ROWS * COLS // 32 * 2, "min": ROWS * COLS // 32 * 2}
    tensors, data_size = plan_layout([("big", planes)])
    radiance = {"format_version": 1, "architecture": "llama", "hyper": {}, "tokenizer": None,
                "chat_template": None, "metadata": {},
                "weights": {"big": weight_json((ROWS, COLS), q4_1(), planes, dict.fromkeys(planes, 0))}}
    header = encode_header(tensors, radiance)
    with open(path, "wb") as file:
        file.write(header)
        file.truncate(len(header) + data_size)
    return planes


def test_a_rank_slice_of_a_sparse_2gib_container_stays_small(tmp_path):
    path = tmp_path / "big.rad"
    planes = sparse_container(path)
    if os.stat(path).st_blocks * 512 > 64 * MiB:
        pytest.skip("this file system does not keep holes")
    process = psutil.Process()
    before = process.memory_info().rss
    with Container(path) as container:
        assert os.path.getsize(path) > 2 * 1024 * MiB
        opened = process.memory_info().rss
        # Rank 3 of 8 by rows: its codes and scales are one byte range of each plane.
        row_start, row_stop = 3 * ROWS // 8, 3 * ROWS // 8 + 64
        codes = container.plane_range("big", "codes", row_start * COLS // 2, row_stop * COLS // 2)
        scale = container.plane_range("big", "scale", row_start * COLS // 16, row_stop * COLS // 16)
        assert codes.nbytes == 2 * MiB and not codes.any() and not scale.any()
        whole = container.plane("big", "min")
        assert whole.nbytes == planes["min"] and whole[-1] == 0
        touched = process.memory_info().rss
    assert opened - before < 16 * MiB, f"opening read {(opened - before) / MiB:.0f} MiB"
    assert touched - before < 32 * MiB, f"a 2 MiB slice cost {(touched - before) / MiB:.0f} MiB"


def test_views_are_over_the_mapping_not_copies(tmp_path):
    path = tmp_path / "big.rad"
    sparse_container(path)
    with Container(path) as container:
        first = container.plane_range("big", "codes", 0, 16)
        again = container.plane("big", "codes")[:16]
        assert np.shares_memory(first, again) and first.base is not None
