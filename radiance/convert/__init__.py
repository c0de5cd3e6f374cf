"""rad-convert: GGUF files, Hugging Face folders and synthetic models to .rad containers, through
the quantiser plugins of the search path (docs/CONVERT.md)."""

from .api import convert, convert_synthetic
from .errors import ConvertError
from .recipe import Recipe
from .report import WeightError, table
from .synthetic import LlamaShape
from .verify import verify

__all__ = ["convert", "convert_synthetic", "verify", "ConvertError", "Recipe", "WeightError", "table", "LlamaShape"]
