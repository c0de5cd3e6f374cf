"""The llama family's multi-token-prediction head, as an architecture of its own, "llama.mtp"
(rad_arch.h's RAD_MTP_SUFFIX): the graph of one step of the head, which the engine runs as a
speculative-decoding draft where a model carries its weights (mtp_layers 1). DeepSeek-V3's MTP
module (arXiv 2412.19437, section 2.2; MiMo and Qwen3-Next carry the same shape):

    h_i' = e_proj . enorm(token_embd[t_(i+1)]) + h_proj . hnorm(h_i)   (DeepSeek's eh_proj over the
                                                                         concatenation, in two halves)
    h_i'' = one more llama block over h_i' (layer `layers`: its own KV cache, at position i)
    logits = lm_head(norm(h_i''))                                        (the model's own lm head)

so from the model's hidden state at position i and the token after it, the head predicts the token
after that. One head: drafting further, the engine hands it its own h'' as the next h (as vLLM
reuses DeepSeek-V3's single MTP layer)."""

from radiance.abi import (
    RAD_EXTENT_TOKENS, RAD_HIDDEN, RAD_MTP_HIDDEN, RAD_MTP_PREVIOUS, RAD_SPLIT_ROWS, GraphBuilder, RadGraphDecl,
    RadTableDecl, rad_tensor,
)
from radiance.abi import arch_family as family

from . import names, source
from .graph import layer
from .hyper import check as check_model
from .rope import inv_freq

def check(hyper: dict) -> str:
    """'' when the model's hyper-parameters declare one MTP head, else the reason."""
    problem = check_model(hyper)
    if problem:
        return problem
    return "" if hyper.get("mtp_layers", 0) == 1 else "the model has no multi-token-prediction head (mtp_layers 0)"


def declare(hyper: dict, weights: dict):
    problem = family.shape_problem(source.weights(hyper), weights, "llama.mtp")
    if problem:
        return problem
    hidden = hyper["hidden"]
    b = GraphBuilder(hyper, weights)
    b.decoder_buffers()
    b.buffer(RAD_MTP_PREVIOUS, hidden)
    b.embedding()  # h = token_embd[the next ids]
    b.rmsnorm("mtp.enorm", RAD_HIDDEN, names.mtp("enorm"), "x")
    b.rmsnorm("mtp.hnorm", RAD_MTP_PREVIOUS, names.mtp("hnorm"), "t")
    # each half into a buffer of its own: on a card at TP 1 an all_gather's output is its input
    # (elide_collectives), so two halves through one part buffer would be one
    for half, operand, out in (("e_proj", "x", "mtp.e"), ("h_proj", "t", "mtp.h")):
        b.buffer(out, hidden)
        b.buffer(f"{out}.part", hidden, split=1)
        b.gemm(f"mtp.{half}", operand, names.mtp(half), f"{out}.part", RAD_SPLIT_ROWS)
        b.node("all_gather", f"mtp.{half}.all_gather", (f"{out}.part", out), RAD_EXTENT_TOKENS, split="n", n=hidden,
               dtype=b.dtype)
    b.node("add", "mtp.add", ("mtp.e", "mtp.h", RAD_HIDDEN), n=hidden, dtype=b.dtype)
    layer(b, hyper["layers"])
    b.head(norm=names.mtp("norm"), rows=RAD_MTP_HIDDEN)
    tables = [RadTableDecl(name="rope.inv_freq", table=rad_tensor(inv_freq(hyper)))]
    return RadGraphDecl(weights=b.declared, tables=tables, buffers=b.buffers, nodes=b.nodes)
