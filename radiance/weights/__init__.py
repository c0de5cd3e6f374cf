"""Weights: the encoding model (decode, size, slice), the .rad container, conversion."""
