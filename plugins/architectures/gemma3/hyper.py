"""The Gemma 3 family's hyper-parameters, as the container's `hyper` holds them, checked."""

from radiance.abi import arch_family as family

INTEGERS = ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context", "sliding_window",
            "query_pre_attn_scalar")
REALS = ("rope_theta", "rope_local_theta", "rms_eps")
LAYER_TYPES = ("sliding", "full")


def check(hyper: dict) -> str:
    """'' when the Gemma 3 graph can be declared from `hyper`, else a one-line reason."""
    problem = family.hyper_problem(hyper, INTEGERS, REALS)
    if problem:
        return problem
    types = hyper.get("layer_types")
    if not isinstance(types, list) or len(types) != hyper["layers"] or any(t not in LAYER_TYPES for t in types):
        return f"hyper-parameter 'layer_types' must be one of {', '.join(LAYER_TYPES)} for each of the {hyper['layers']} layers"
    scaling = hyper.get("rope_scaling")
    if scaling and (scaling.get("rope_type") != "linear" or not scaling.get("factor", 0) > 0):
        return f"rope_scaling {scaling!r} is not linear with a positive factor (Gemma 3's global layers)"
    return ""
