"""What rad-convert does, as functions: convert a GGUF file or a Hugging Face folder, write a
synthetic model. Each returns the error report or raises; none prints but the progress bar."""

from pathlib import Path

from .errors import ConvertError
from .gguf_import import read_gguf
from .hf_import import read_hf
from .pipeline import write_model
from .quantizers import Quantizers
from .recipe import Recipe
from .synthetic import LlamaShape, synthetic_llama

GGUF_MAGIC = b"GGUF"


def _recipe(recipe, quantizers: Quantizers) -> Recipe:
    return Recipe.load(recipe, quantizers) if recipe is not None else Recipe.empty(quantizers)


def convert(source, output, recipe=None, radiance_home=None) -> list:
    """Convert a GGUF file (imported as it is) or a Hugging Face folder (quantised by `recipe`, a
    TOML or JSON file) to the .rad file `output`. Returns the error report ([WeightError])."""
    source = Path(source)
    if not source.exists():
        raise ConvertError(source, "does not exist")
    if source.is_dir():
        with Quantizers(radiance_home) as quantizers:
            model = read_hf(source, _recipe(recipe, quantizers))
            return write_model(output, model, quantizers.by_name)
    with open(source, "rb") as file:
        if file.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
            raise ConvertError(source, "is neither a GGUF file nor a Hugging Face folder "
                                       "(config.json, *.safetensors, tokenizer.json)")
    if recipe is not None:
        raise ConvertError(recipe, "a GGUF file is imported as it is, without requantising; "
                                   "--recipe applies to Hugging Face folders and --synthetic")
    return write_model(output, read_gguf(source))


def convert_synthetic(output, shape: LlamaShape, seed: int = 0, recipe=None, radiance_home=None) -> list:
    """Write a synthetic llama model of `shape` with seeded random weights to `output`."""
    with Quantizers(radiance_home) as quantizers:
        model = synthetic_llama(shape, seed, _recipe(recipe, quantizers))
        return write_model(output, model, quantizers.by_name)
