"""rad-convert: GGUF files, Hugging Face folders and synthetic models to .rad containers, through
the architecture and quantiser plugins of the search path (docs/CONVERT.md)."""

from .api import convert, convert_synthetic, synthetic_options
from .errors import ConvertError
from .recipe import Recipe
from .report import WeightError, table
from .verify import verify

__all__ = ["convert", "convert_synthetic", "synthetic_options", "verify", "ConvertError", "Recipe", "WeightError",
           "table"]
