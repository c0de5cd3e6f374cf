"""What rad-convert does, as functions: convert a GGUF file or a Hugging Face folder, write a
synthetic model. Each returns the error report or raises; none prints but the progress bar. The
family of a source is whichever architecture plugin on the search path takes it."""

from pathlib import Path

from radiance.abi import RAD_SOURCE_SYNTHETIC

from .cache import is_gguf
from .errors import ConvertError
from .families import taking
from .gguf_import import read_gguf
from .hf_import import read_hf
from .pipeline import write_model
from .plugins import Plugins
from .recipe import Recipe
from .synthetic import synthetic_model


def _recipe(recipe, plugins: Plugins) -> Recipe:
    return Recipe.load(recipe, plugins) if recipe is not None else Recipe.empty(plugins)


def convert(source, output, recipe=None, radiance_home=None, progress: str | None = None) -> list:
    """Convert a GGUF file (imported as it is) or a Hugging Face folder (quantised by `recipe`, a
    TOML or JSON file) to the .rad file `output`. Returns the error report ([WeightError]).
    `progress`: the progress bar's label (default: rad-convert OUTPUT)."""
    source = Path(source)
    if not source.exists():
        raise ConvertError(source, "does not exist")
    with Plugins(radiance_home) as plugins:
        if source.is_dir():
            model = read_hf(source, _recipe(recipe, plugins), plugins.families)
            return write_model(output, model, plugins.by_name, progress=progress)
        if not is_gguf(source):
            raise ConvertError(source, "is neither a GGUF file nor a Hugging Face folder "
                                       "(config.json, *.safetensors, tokenizer.json)")
        if recipe is not None:
            raise ConvertError(recipe, "a GGUF file is imported as it is, without requantising; "
                                       "--recipe applies to Hugging Face folders and --synthetic")
        return write_model(output, read_gguf(source, plugins.families), progress=progress)


def convert_synthetic(output, family: str, shape: dict | None = None, seed: int = 0, recipe=None,
                      radiance_home=None) -> list:
    """Write a synthetic model of the family `family` (an architecture plugin that takes --synthetic
    with that name) with seeded random weights to `output`; `shape` sets the family's shape options
    ({"hidden": 4096, ...}; its defaults for the rest)."""
    with Plugins(radiance_home) as plugins:
        model = synthetic_model(family, dict(shape or {}), seed, _recipe(recipe, plugins), plugins.families)
        return write_model(output, model, plugins.by_name)


def synthetic_options(family: str, radiance_home=None) -> list:
    """The shape options of a family's synthetic models: [RadArchOption] (key, type, default, doc)."""
    with Plugins(radiance_home) as plugins:
        try:
            found, _ = taking(plugins.families, RAD_SOURCE_SYNTHETIC, [family])
        except ValueError as error:
            raise ConvertError(f"--synthetic {family}", str(error)) from None
        return list(found.info.synthetic)
