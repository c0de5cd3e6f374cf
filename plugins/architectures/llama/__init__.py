"""The llama architecture: Llama 2/3, SmolLM2 and their kin at any weight format a kernel library
reads. It checks the container's hyper-parameters and declares the graph of one step and its
tensor-parallel plan as data; the engine resolves and runs it, and alone knows the ranks. Its import
hooks (source.py) tell rad-convert how the family's GGUF files and Hugging Face folders are read."""

from radiance.abi import RAD_ABI_VERSION, RAD_MTP_SUFFIX, RAD_PLUGIN_ARCH, RadArchInfo, RadPluginInfo
from radiance.abi import arch_family as family

from . import mtp, source
from .graph import declare as declare_graph
from .hyper import check


def declare(hyper: dict, weights: dict):
    """The graph, or a one-line reason naming the weight that does not fit."""
    if "rope_freqs" in weights:
        return ("weight 'rope_freqs' is from an older rad-convert, which left Llama 3.1's rope scaling "
                "unapplied: convert the GGUF file again (its factors are hyper-parameters now)")
    return family.shape_problem(source.weights(hyper), weights, "llama") or declare_graph(hyper, weights)


ARCHITECTURES = [RadArchInfo(name="llama", doc="Llama-family decoder: GQA, rope (theta, linear, llama3, "
                                            "rope_freqs), SwiGLU, RMSNorm, tied or separate lm head",
                             check=check, declare=declare, takes=source.takes, hyper=source.hyper,
                             weights=source.weights, synthetic=source.SYNTHETIC),
                 RadArchInfo(name="llama" + RAD_MTP_SUFFIX, doc="the multi-token-prediction head of a llama model "
                             "that carries one (mtp_layers 1): the model's own speculative draft",
                             check=mtp.check, declare=mtp.declare)]


def rad_plugin_abi_version():
    return RAD_ABI_VERSION


def rad_plugin_info():
    return RadPluginInfo(RAD_PLUGIN_ARCH, "llama", "0.2", "the llama family", "")


def rad_arch_count():
    return len(ARCHITECTURES)


def rad_arch_at(i):
    return ARCHITECTURES[i]
