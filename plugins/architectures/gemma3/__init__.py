"""The Gemma 3 architecture (Gemma 3 270M, 1B and the text layers of the larger ones): embeddings
scaled by sqrt(hidden), RMSNorm by 1 + w, norms before and after attention and the MLP, q and k
normed per head, GeGLU with tanh GELU, head_dim 256, sliding-window layers (5 of every 6) and global
ones each with its own rope base, tied embeddings. It checks the container's hyper-parameters and
declares the graph of one step and its tensor-parallel plan as data; its import hooks (source.py)
tell rad-convert how the family's GGUF files and Hugging Face folders are read."""

from radiance.abi import RAD_ABI_VERSION, RAD_PLUGIN_ARCH, RadArchInfo, RadPluginInfo
from radiance.abi import arch_family as family

from . import source
from .graph import declare as declare_graph
from .hyper import check


def declare(hyper: dict, weights: dict):
    """The graph, or a one-line reason naming the weight that does not fit."""
    return family.shape_problem(source.weights(hyper), weights, "gemma3") or declare_graph(hyper, weights)


ARCHITECTURES = [RadArchInfo(name="gemma3", doc="Gemma 3 decoder: scaled embeddings, (1 + w) RMSNorm before and "
                                             "after attention and MLP, q/k norms, GeGLU (tanh), sliding-window "
                                             "and global layers with their own rope bases, tied lm head",
                             check=check, declare=declare, takes=source.takes, hyper=source.hyper,
                             weights=source.weights, synthetic=source.SYNTHETIC)]


def rad_plugin_abi_version():
    return RAD_ABI_VERSION


def rad_plugin_info():
    return RadPluginInfo(RAD_PLUGIN_ARCH, "gemma3", "0.1", "the Gemma 3 family", "")


def rad_arch_count():
    return len(ARCHITECTURES)


def rad_arch_at(i):
    return ARCHITECTURES[i]
