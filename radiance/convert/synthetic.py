"""A synthetic model of any family an architecture plugin takes, of any shape its options give:
seeded random weights as the plugin's weights() says (N(0, 0.02), ones, zeros or the identity), for tests and
benchmarks (as vLLM's --load-format dummy). Each weight draws from its own generator, seeded by
(seed, crc32 of its name), in row order, so its values do not depend on the row blocks its quantiser
asks for, on the recipe, or on which other weights exist; memory stays bounded by a row block
whatever the size (a Llama-3-8B shape streams)."""

import zlib

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from radiance.abi import RAD_FILL_IDENTITY, RAD_FILL_NORMAL, RAD_FILL_ONES, RAD_SOURCE_SYNTHETIC, RadSourceInfo

from .errors import ConvertError
from .families import taking
from .pipeline import Model

STD = 0.02
SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>")


def tokenizer_hyper(vocab: int) -> dict:
    """The hyper-parameters of the synthetic tokenizer (BOS 256, EOS 257 where the vocabulary holds them)."""
    specials = vocab >= 256 + len(SPECIALS)
    return {"bos_token_id": 256 if specials else None, "eos_token_ids": [257] if specials else [],
            "add_bos": specials}


def synthetic_tokenizer(vocab: int) -> str | None:
    """Byte-level tokens (ids 0-255, no merges), BOS and EOS (256, 257), reserved fillers up to
    `vocab`: every text encodes and decodes. None when the vocabulary is too small to hold them."""
    if vocab < 256 + len(SPECIALS):
        return None
    tokens = sorted(pre_tokenizers.ByteLevel.alphabet())
    fillers = [f"<|reserved_{i}|>" for i in range(vocab - 256 - len(SPECIALS))]
    tokenizer = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIALS) + fillers)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{SPECIALS[0]} $A", pair=f"{SPECIALS[0]} $A {SPECIALS[0]} $B:1", special_tokens=[(SPECIALS[0], 256)])
    return tokenizer.to_str()


def _rows_of(seed: int, name: str, shape: tuple, fill: int):
    """rows_of(r0, r1) for one weight, asked in row order."""
    cols = shape[-1]
    if fill == RAD_FILL_IDENTITY:  # a square matrix (families.py checks): row r has its one at column r
        return lambda r0, r1: np.eye(r1 - r0, cols, r0, np.float32)
    if fill != RAD_FILL_NORMAL:
        value = np.float32(1 if fill == RAD_FILL_ONES else 0)
        return lambda r0, r1: np.full((r1 - r0, cols), value, np.float32)
    generator = np.random.default_rng([seed, zlib.crc32(name.encode())])
    next_row = [0]

    def rows_of(r0, r1):
        if r0 != next_row[0]:
            raise ValueError(f"rows [{r0}, {r1}) asked out of order (next is row {next_row[0]})")
        next_row[0] = r1
        rows = generator.standard_normal((r1 - r0, cols), np.float32)
        rows *= np.float32(STD)
        return rows
    return rows_of


def synthetic_model(name: str, options: dict, seed: int, recipe, families: list) -> Model:
    """A model of the family `name` (an architecture that takes --synthetic NAME) with the shape
    `options` give ({key: value}; the family's defaults for the rest), each weight quantised as
    `recipe` (a Recipe) chooses."""
    source = f"--synthetic {name}"
    try:
        family, taken = taking(families, RAD_SOURCE_SYNTHETIC, [name])
        shape = family.options(options)
        hyper = family.hyper(RadSourceInfo(kind=RAD_SOURCE_SYNTHETIC, family=taken, meta=shape))
        vocab = hyper.get("vocab")
        if not isinstance(vocab, int) or vocab < 1:
            raise ValueError(f"{family.name}'s hyper-parameters give no vocabulary size ('vocab' is {vocab!r})")
        hyper.update(tokenizer_hyper(vocab))
        specs = [spec for spec in family.weights(hyper) if spec.name]
    except ValueError as error:
        raise ConvertError(source, str(error)) from None
    jobs = []
    for spec in specs:
        quantizer, options = recipe.choose(spec.name, spec.ndim)
        try:
            jobs.append(quantizer.job(spec.name, spec.shape, _rows_of(seed, spec.name, spec.shape, spec.fill), options))
        except ValueError as error:
            raise ConvertError(recipe.path, f"weight {spec.name!r}: {error}") from None
    return Model(source, family.name, hyper, synthetic_tokenizer(vocab), None, jobs,
                 {"source_format": "synthetic", "seed": seed, "recipe": str(recipe.path), "shape": shape})
