"""A Hugging Face tokenizer.json built from a GGUF file's tokenizer.ggml.* metadata.

Model "gpt2" (byte-level BPE): the tokens and merges as they are, the pre-tokenizer llama.cpp uses
for tokenizer.ggml.pre. Model "llama" (SentencePiece's BPE vocabularies: Llama 2, Mistral, Gemma):
llama.cpp's SPM tokenizer, which merges the adjacent pair whose joined text is the token of highest
score (the leftmost among equals) until none is, spelled as a BPE whose merges are every pair of
tokens joining to a token, ranked by that token's score; spaces as U+2581, a leading one where
add_space_prefix says (at the start and after every added token, as llama.cpp's fragments), bytes
no token covers as <0xXX> tokens. Both: control tokens (token_type 3) as special added tokens,
user-defined ones (4) as plain added tokens, matched whole in the raw text; BOS/EOS added by the
post-processor when add_bos_token/add_eos_token say.
"""

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types
SPACE = "\u2581"  # SentencePiece's ▁
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


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
    """Every (left, right) of two tokens joining to a token, the joined token's score highest first
    (then its id): the order llama.cpp's SPM tokenizer merges in."""
    ids = {token: i for i, token in enumerate(tokens)}
    found = []
    for token, score, kind in zip(tokens, scores, types):
        if kind not in (NORMAL, USER_DEFINED, UNUSED) or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                found.append((-score, ids[token], ids[left], left, right))
    found.sort()
    return [(left, right) for _, _, _, left, right in found]


def _spm(value, tokens: list[str], types: list[int]) -> Tokenizer:
    scores = value("tokenizer.ggml.scores", None)
    if scores is None:
        raise ValueError("tokenizer.ggml.model 'llama' needs tokenizer.ggml.scores, which is missing")
    unknown = value("tokenizer.ggml.unknown_token_id", None)
    model = models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=spm_merges(tokens, scores, types),
                       unk_token=tokens[unknown] if unknown is not None else None, byte_fallback=True,
                       fuse_unk=True)
    tokenizer = Tokenizer(model)
    steps = [normalizers.Prepend(SPACE)] if value("tokenizer.ggml.add_space_prefix", True) else []
    tokenizer.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", SPACE)])
    tokenizer.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tokenizer


def _bpe(value, tokens: list[str]) -> Tokenizer:
    pre = value("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"tokenizer.ggml.pre {pre!r} is not imported (supported: {', '.join(PRE_TOKENIZERS)})")
    merges = [tuple(merge.split(" ", 1)) for merge in value("tokenizer.ggml.merges")]
    pre_tokenizer, ignore_merges = PRE_TOKENIZERS[pre]()
    tokenizer = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(tokens)}, merges=merges,
                                     ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


MODELS = {"gpt2": "byte-level BPE", "llama": "SentencePiece BPE, llama.cpp's SPM"}


def gguf_tokenizer(value) -> str | None:
    """tokenizer.json text; `value(key, default)` reads GGUF metadata. ValueError names what is unsupported."""
    model = value("tokenizer.ggml.model", None)
    if model is None:
        return None
    if model not in MODELS:
        supported = ", ".join(f"{name} ({what})" for name, what in MODELS.items())
        raise ValueError(f"tokenizer.ggml.model {model!r} is not imported (supported: {supported})")
    tokens = value("tokenizer.ggml.tokens")
    types = value("tokenizer.ggml.token_type", [NORMAL] * len(tokens))
    tokenizer = _spm(value, tokens, types) if model == "llama" else _bpe(value, tokens)
    tokenizer.add_tokens([AddedToken(token, special=kind == CONTROL, normalized=False)
                          for token, kind in zip(tokens, types) if kind in (CONTROL, USER_DEFINED)])
    processor = _post_processor(tokens, value("tokenizer.ggml.bos_token_id", None),
                                value("tokenizer.ggml.eos_token_id", None),
                                bool(value("tokenizer.ggml.add_bos_token", False)),
                                bool(value("tokenizer.ggml.add_eos_token", False)))
    if processor is not None:
        tokenizer.post_processor = processor
    return tokenizer.to_str()
