"""A Hugging Face tokenizer.json built from a GGUF file's tokenizer.ggml.* metadata.

Model "gpt2" (byte-level BPE): the tokens and merges as they are, the pre-tokenizer llama.cpp uses
for tokenizer.ggml.pre, control tokens (token_type 3) as special added tokens, user-defined ones
(4) as plain added tokens, BOS/EOS added by the post-processor when add_bos_token/add_eos_token say.
"""

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types
# llama.cpp's LLAMA_VOCAB_PRE_TYPE_LLAMA3 expression, as Llama 3's own tokenizer.json has it
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(use_regex=True):
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


PRE_TOKENIZERS = {  # tokenizer.ggml.pre -> (pre-tokenizer, ignore_merges)
    "gpt-2": lambda: (_byte_level(), False),
    "smollm": lambda: (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()]), False),
    "llama-bpe": lambda: (pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False), _byte_level(False)]), True),
}


def _post_processor(tokens, bos, eos, add_bos, add_eos):
    if add_bos and bos is None or add_eos and eos is None:
        raise ValueError("add_bos_token/add_eos_token is set but the bos/eos token id is missing")
    if not (add_bos or add_eos):
        return None

    def sequence(piece, type_id):
        return ([f"{tokens[bos]}:{type_id}"] * add_bos + [f"{piece}:{type_id}"]
                + [f"{tokens[eos]}:{type_id}"] * add_eos)

    ends = [(tokens[bos], bos)] * add_bos + [(tokens[eos], eos)] * add_eos
    return processors.TemplateProcessing(single=" ".join(sequence("$A", 0)),
                                         pair=" ".join(sequence("$A", 0) + sequence("$B", 1)),
                                         special_tokens=list(dict.fromkeys(ends)))


def gguf_tokenizer(value) -> str | None:
    """tokenizer.json text; `value(key, default)` reads GGUF metadata. ValueError names what is unsupported."""
    model = value("tokenizer.ggml.model", None)
    if model is None:
        return None
    if model != "gpt2":
        raise ValueError(f"tokenizer.ggml.model {model!r} is not imported (supported: gpt2, byte-level BPE)")
    pre = value("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"tokenizer.ggml.pre {pre!r} is not imported (supported: {', '.join(PRE_TOKENIZERS)})")
    tokens = value("tokenizer.ggml.tokens")
    types = value("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(merge.split(" ", 1)) for merge in value("tokenizer.ggml.merges")]
    pre_tokenizer, ignore_merges = PRE_TOKENIZERS[pre]()
    tokenizer = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges,
                                     ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens([AddedToken(token, special=kind == CONTROL, normalized=False)
                          for token, kind in zip(tokens, types) if kind in (CONTROL, USER_DEFINED)])
    processor = _post_processor(tokens, value("tokenizer.ggml.bos_token_id", None),
                                value("tokenizer.ggml.eos_token_id", None),
                                bool(value("tokenizer.ggml.add_bos_token", False)),
                                bool(value("tokenizer.ggml.add_eos_token", False)))
    if processor is not None:
        tokenizer.post_processor = processor
    return tokenizer.to_str()
