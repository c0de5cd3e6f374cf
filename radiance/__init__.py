"""Radiance: a multi-process tensor-parallel LLM inference runtime whose kernels, model
architectures and quantisers are plugins found on $RADIANCE_HOME."""

__version__ = "0.1.0"
