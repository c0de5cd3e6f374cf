"""GraphBuilder: what every architecture plugin's declare hook writes the same way — weights,
f32 buffers, nodes, and the two ops whose parameters come from the weights and the hyper-parameters
(gemm: N, K, wdtype; rmsnorm: n, eps). A family's builder adds its own ops on top. Part of the
contract package because a plugin imports nothing of radiance's but it."""

from .arch import RadBufferDecl, RadNodeDecl, RadWeightDecl
from .constants import RAD_DT_F32, RAD_EXTENT_TOKENS, RAD_SPLIT_COLS, RAD_SPLIT_NONE, RAD_SPLIT_ROWS

TOKENS = RAD_EXTENT_TOKENS


class GraphBuilder:
    def __init__(self, hyper: dict, weights: dict):
        self.hyper, self.weights = hyper, weights  # weights: {name: RadWeightInfo}
        self.dtype = hyper.get("activation_dtype", "f32")
        self.nodes, self.buffers, self.declared = [], [], []

    def weight(self, name: str, split: int, source: str = "", parts: int = 0) -> str:
        self.declared.append(RadWeightDecl(name=name, source=source, split=split, parts=parts))
        return name

    def buffer(self, name: str, cols: int, extent: int = TOKENS, split: int = 0, parts: int = 0) -> str:
        self.buffers.append(RadBufferDecl(name=name, dtype=RAD_DT_F32, extent=extent, cols=cols, split=split,
                                          parts=parts))
        return name

    def node(self, op, name, operands, extent=TOKENS, split="", **params):
        self.nodes.append(RadNodeDecl(op=op, name=name, extent=extent, params=params, split=split,
                                      operands=tuple(operands)))

    def gemm(self, name, x, weight, y, split, extent=TOKENS, source="", parts=0):
        """y = x . weight^T; split RAD_SPLIT_ROWS shards N, RAD_SPLIT_COLS shards K (as `parts` heads)."""
        info = self.weights[source or weight]
        self.weight(weight, split, source, parts)
        key = {RAD_SPLIT_ROWS: "N", RAD_SPLIT_COLS: "K"}[split]
        self.node("gemm", name, (x, weight, y), extent, split=f"{key}/{parts}" if parts else key,
                  N=info.rows, K=info.cols, wdtype=info.format, dtype=self.dtype)

    def rmsnorm(self, name, x, weight, y, extent=TOKENS):
        self.weight(weight, RAD_SPLIT_NONE)
        self.node("rmsnorm", name, (x, weight, y), extent, n=self.hyper["hidden"],
                  eps=float(self.hyper["rms_eps"]), dtype=self.dtype)
