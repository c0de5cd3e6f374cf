"""A synthetic llama model of any shape: seeded random weights, N(0, 0.02) for matrices and 1 for
norms, for tests and benchmarks (as vLLM's --load-format dummy). Each weight draws from its own
generator, seeded by (seed, crc32 of its name), in row order, so its values do not depend on the row
blocks its quantiser asks for, on the recipe, or on which other weights exist; memory stays bounded
by a row block whatever the size (a Llama-3-8B shape streams)."""

import zlib
from dataclasses import asdict, dataclass

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from .errors import ConvertError
from .names import llama_weights
from .pipeline import Model

SOURCE = "--synthetic llama"
STD = 0.02
SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>")


@dataclass
class LlamaShape:
    hidden: int = 576
    layers: int = 30
    heads: int = 9
    kv_heads: int = 3
    ffn: int = 1536
    vocab: int = 49152
    context: int = 2048
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    head_dim: int | None = None  # hidden / heads when None
    rms_eps: float = 1e-5


def _hyper(shape: LlamaShape) -> dict:
    counts = {key: value for key, value in asdict(shape).items() if isinstance(value, int) and not isinstance(value, bool)}
    bad = [key for key, value in counts.items() if value < 1]
    if bad:
        raise ConvertError(SOURCE, f"--{bad[0].replace('_', '-')} {counts[bad[0]]} is not a positive count")
    if shape.head_dim is None and shape.hidden % shape.heads:
        raise ConvertError(SOURCE, f"--hidden {shape.hidden} is not a multiple of --heads {shape.heads}")
    if shape.heads % shape.kv_heads:
        raise ConvertError(SOURCE, f"--heads {shape.heads} is not a multiple of --kv-heads {shape.kv_heads}")
    specials = shape.vocab >= 256 + len(SPECIALS)
    return {"hidden": shape.hidden, "layers": shape.layers, "heads": shape.heads, "kv_heads": shape.kv_heads,
            "head_dim": shape.head_dim or shape.hidden // shape.heads, "ffn": shape.ffn, "vocab": shape.vocab,
            "context": shape.context, "rope_theta": float(shape.rope_theta), "rms_eps": float(shape.rms_eps),
            "tie_embeddings": shape.tie_embeddings, "rope_interleaved": 0,
            "bos_token_id": 256 if specials else None, "eos_token_ids": [257] if specials else [],
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


def _rows_of(seed: int, name: str, shape: tuple):
    """rows_of(r0, r1) for one weight, asked in row order."""
    if len(shape) == 1:
        return lambda r0, r1: np.ones((1, shape[0]), np.float32)
    generator = np.random.default_rng([seed, zlib.crc32(name.encode())])
    next_row = [0]

    def rows_of(r0, r1):
        if r0 != next_row[0]:
            raise ValueError(f"rows [{r0}, {r1}) asked out of order (next is row {next_row[0]})")
        next_row[0] = r1
        rows = generator.standard_normal((r1 - r0, shape[1]), np.float32)
        rows *= np.float32(STD)
        return rows
    return rows_of


def synthetic_llama(shape: LlamaShape, seed: int, recipe) -> Model:
    """A llama model of `shape`, each weight quantised as `recipe` (a Recipe) chooses."""
    hyper = _hyper(shape)
    jobs = []
    for name, dims in llama_weights(hyper):
        quantizer, options = recipe.choose(name, len(dims))
        try:
            jobs.append(quantizer.job(name, dims, _rows_of(seed, name, dims), options))
        except ValueError as error:
            raise ConvertError(recipe.path, f"weight {name!r}: {error}") from None
    return Model(SOURCE, "llama", hyper, synthetic_tokenizer(shape.vocab), None, jobs,
                 {"source_format": "synthetic", "seed": seed, "recipe": str(recipe.path)})
