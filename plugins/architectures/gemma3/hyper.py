"""The Gemma 3 family's hyper-parameters, as the container's `hyper` holds them, checked."""

INTEGERS = ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context", "sliding_window",
            "query_pre_attn_scalar")
REALS = ("rope_theta", "rope_local_theta", "rms_eps")
LAYER_TYPES = ("sliding", "full")


def check(hyper: dict) -> str:
    """'' when the Gemma 3 graph can be declared from `hyper`, else a one-line reason."""
    for key in INTEGERS:
        value = hyper.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"hyper-parameter '{key}' must be a positive integer, not {value!r}"
    for key in REALS:
        value = hyper.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            return f"hyper-parameter '{key}' must be a positive number, not {value!r}"
    if hyper["heads"] % hyper["kv_heads"]:
        return f"heads ({hyper['heads']}) must be a multiple of kv_heads ({hyper['kv_heads']})"
    if hyper["head_dim"] % 2:
        return f"head_dim ({hyper['head_dim']}) must be even for rope"
    types = hyper.get("layer_types")
    if not isinstance(types, list) or len(types) != hyper["layers"] or any(t not in LAYER_TYPES for t in types):
        return f"hyper-parameter 'layer_types' must be one of {', '.join(LAYER_TYPES)} for each of the {hyper['layers']} layers"
    scaling = hyper.get("rope_scaling")
    if scaling and (scaling.get("rope_type") != "linear" or not scaling.get("factor", 0) > 0):
        return f"rope_scaling {scaling!r} is not linear with a positive factor (Gemma 3's global layers)"
    return ""
