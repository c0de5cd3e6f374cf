"""Rope frequencies as data: theta, and the linear or llama3 scaling or Llama 3.1's per-frequency
divisors as a GGUF file carries them (rope_freqs, kept as the hyper-parameter rope_freq_factors),
computed once here so the rope kernel sees only a table inv_freq f32 [head_dim / 2]."""

import math

import numpy as np

from .hyper import scaling_type


def inv_freq(hyper: dict) -> np.ndarray:
    head_dim = hyper["head_dim"]
    frequencies = 1.0 / hyper["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = hyper.get("rope_scaling") or {}
    if scaling_type(scaling) == "linear":
        frequencies = frequencies / scaling["factor"]
    elif scaling_type(scaling) == "llama3":
        frequencies = _llama3(frequencies, scaling)
    factors = hyper.get("rope_freq_factors")
    if factors is not None:  # llama.cpp's freq_factors: theta_i = position * base^(-2i/d) / factor_i
        frequencies = frequencies / np.asarray(factors, np.float64)
    return frequencies.astype(np.float32)


def _llama3(frequencies: np.ndarray, scaling: dict) -> np.ndarray:
    """Meta's llama 3.1 scheme: long wavelengths divided by `factor`, short ones kept, a smooth
    blend between the two bands."""
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    original = scaling.get("original_max_position_embeddings", 8192)
    wavelength = 2 * math.pi / frequencies
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * frequencies / factor + smooth * frequencies
    return np.where(wavelength > original / low, frequencies / factor,
                    np.where(wavelength < original / high, frequencies, blended))
