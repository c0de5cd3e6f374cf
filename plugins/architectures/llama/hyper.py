"""The llama family's hyper-parameters, as the container's `hyper` holds them, checked."""

from radiance.abi import arch_family as family

INTEGERS = ("hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "context")
REALS = ("rope_theta", "rms_eps")


def check(hyper: dict) -> str:
    """'' when the llama graph can be declared from `hyper`, else a one-line reason."""
    problem = family.hyper_problem(hyper, INTEGERS, REALS)
    if problem:
        return problem
    scaling = hyper.get("rope_scaling")
    if scaling and scaling_type(scaling) not in ("linear", "llama3"):
        return f"rope_scaling type {scaling_type(scaling)!r} is not one of linear, llama3"
    mtp = hyper.get("mtp_layers", 0)
    if mtp not in (0, 1) or isinstance(mtp, bool):
        return f"hyper-parameter 'mtp_layers' must be 0 or 1 (one multi-token-prediction head), not {mtp!r}"
    return freq_factors_problem(hyper)


def freq_factors_problem(hyper: dict) -> str:
    """rope_freq_factors (Llama 3.1's rope_freqs, as llama.cpp writes it): head_dim / 2 positive numbers."""
    factors = hyper.get("rope_freq_factors")
    if factors is None:
        return ""
    if (not isinstance(factors, list) or len(factors) != hyper["head_dim"] // 2
            or not all(isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in factors)):
        return f"rope_freq_factors must be {hyper['head_dim'] // 2} positive numbers (head_dim / 2)"
    return ""


def scaling_type(scaling: dict) -> str | None:
    """Hugging Face says rope_type (older configs: type)."""
    return scaling.get("rope_type", scaling.get("type"))
