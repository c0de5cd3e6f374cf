"""The llama architecture: Llama 2/3, SmolLM2 and their kin at any weight format a kernel library
reads. It checks the container's hyper-parameters and declares the graph of one step and its
tensor-parallel plan as data; the engine resolves and runs it, and alone knows the ranks."""

from radiance.abi import RAD_ABI_VERSION, RAD_PLUGIN_ARCH, RadArchInfo, RadPluginInfo

from . import names
from .graph import declare as declare_graph
from .hyper import check


def _expected_shapes(hyper: dict) -> dict:
    hidden, head_dim, ffn = hyper["hidden"], hyper["head_dim"], hyper["ffn"]
    q, kv = hyper["heads"] * head_dim, hyper["kv_heads"] * head_dim
    shapes = {names.EMBEDDING: (hyper["vocab"], hidden), names.OUTPUT_NORM: (1, hidden)}
    for i in range(hyper["layers"]):
        shapes.update({names.layer(i, "attn_norm"): (1, hidden), names.layer(i, "ffn_norm"): (1, hidden),
                       names.layer(i, "attn.q"): (q, hidden), names.layer(i, "attn.k"): (kv, hidden),
                       names.layer(i, "attn.v"): (kv, hidden), names.layer(i, "attn.o"): (hidden, q),
                       names.layer(i, "ffn.gate"): (ffn, hidden), names.layer(i, "ffn.up"): (ffn, hidden),
                       names.layer(i, "ffn.down"): (hidden, ffn)})
    return shapes


def declare(hyper: dict, weights: dict):
    """The graph, or a one-line reason naming the weight that does not fit."""
    expected = _expected_shapes(hyper)
    if names.OUTPUT in weights:
        expected[names.OUTPUT] = (hyper["vocab"], hyper["hidden"])
    for name, shape in expected.items():
        if name not in weights:
            return f"weight '{name}' is missing"
        found = (weights[name].rows, weights[name].cols)
        if found != shape:
            return f"weight '{name}' is {found[0]}x{found[1]}, llama with these hyper-parameters needs {shape[0]}x{shape[1]}"
    return declare_graph(hyper, weights)


ARCHITECTURES = [RadArchInfo(name="llama", doc="Llama-family decoder: GQA, rope (theta, linear, llama3), "
                                            "SwiGLU, RMSNorm, tied or separate lm head", check=check, declare=declare)]


def rad_plugin_abi_version():
    return RAD_ABI_VERSION


def rad_plugin_info():
    return RadPluginInfo(RAD_PLUGIN_ARCH, "llama", "0.1", "the llama family", "")


def rad_arch_count():
    return len(ARCHITECTURES)


def rad_arch_at(i):
    return ARCHITECTURES[i]
