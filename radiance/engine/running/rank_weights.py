"""One rank's weights: its slice of each declared weight, mapped from the container (a row split
touches only its own rows' pages), and the form each row asked for through its layout hook."""

import numpy as np

from radiance.abi import (
    RAD_DT_ENCODED, RAD_DT_NONE, RAD_E_DTYPE, RAD_E_SHAPE, RAD_OK, RadTensor, RadWeightPlanes, rad_tensor,
)
from radiance.weights.planes import plane_nbytes, plane_shape
from radiance.weights.slicing import row_byte_ranges, slice_cols

from radiance.engine.selection.bands import SelectionError
from radiance.engine.selection.shard import Shard, weight_cut


class RankWeights:
    """Each plane is brought into the rank through the link scheduler, in chunks that never run
    while a collective holds the link gate."""

    def __init__(self, model, shard: Shard, link, load: bool = True):
        """`load`: copy each plane into the rank's memory; a card rank keeps the mapped views, which
        go to the card directly."""
        self.model, self.link, self.load = model, link, load
        self.planes: dict[str, RadWeightPlanes] = {}
        self.formats: dict[str, str] = {}
        self._stored: dict = {}
        for decl in model.graph.weights:
            self.planes[decl.name] = self._slice(decl, shard)
            self.formats[decl.name] = model.weights[decl.source or decl.name].format

    def _slice(self, decl, shard: Shard) -> RadWeightPlanes:
        container, source = self.model.container, decl.source or decl.name
        info = self.model.weights[source]
        encoding, shape = container.encoding(source), (info.rows, info.cols)
        cut = weight_cut(decl.split, info.rows, info.cols, shard, decl.name)
        if cut is None:
            planes = {p.name: container.plane(source, p.name) for p in encoding.planes}
        elif cut[0] == 0:
            ranges = row_byte_ranges(encoding, shape, cut[1], cut[2], decl.name)
            planes = {p: container.plane_range(source, p, start, stop) for p, (start, stop) in ranges.items()}
            shape = (cut[2] - cut[1], info.cols)
        else:
            full = {p.name: container.plane(source, p.name) for p in encoding.planes}
            planes, shape = slice_cols(encoding, full, shape, cut[1], cut[2], decl.name)
        tensors, transfers = [], []
        for plane in encoding.planes:
            rows, _ = plane_shape(plane, shape)
            source = planes[plane.name].reshape(-1)
            assert source.size == plane_nbytes(plane, shape), (decl.name, plane.name)
            loaded = source
            if self.load:
                loaded = np.empty_like(source)
                transfers.append(self.link.copy(loaded, source, f"weight {decl.name}.{plane.name}"))
            tensors.append(rad_tensor(loaded.reshape(rows, -1)))
        for transfer in transfers:
            transfer.wait()
        return RadWeightPlanes(encoding=encoding, rows=shape[0], cols=shape[1], planes=tensors)

    def operand(self, name: str, row, geometry: dict) -> RadTensor:
        """The weight as `row` reads it: its own form when its layout hook says RAD_OK."""
        key = (name, id(row))
        if key in self._stored:
            return self._stored[key]
        weight = self.planes[name]
        code = row.info.layout(name, weight.encoding, dict(geometry)) if row.info.layout else None
        where = f"weight '{name}' ({self.formats[name]}): row {row.plugin.name}:{row.name}"
        if code == RAD_E_DTYPE:
            raise SelectionError(f"{where} does not read this encoding (layout returned RAD_E_DTYPE)")
        if code == RAD_E_SHAPE:
            raise SelectionError(f"{where} does not take this shape (layout returned RAD_E_SHAPE)")
        if code == RAD_OK:
            stored = row.info.relayout(weight, dict(geometry))
            tensor = RadTensor(data=stored, dtype=RAD_DT_NONE, ndim=2, shape=(weight.rows, weight.cols, 0, 0))
        else:
            tensor = RadTensor(data=weight, dtype=RAD_DT_ENCODED, ndim=2, shape=(weight.rows, weight.cols, 0, 0))
        self._stored[key] = tensor
        return tensor
