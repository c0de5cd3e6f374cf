"""Speculative decoding with a model's own MTP heads, against plain decoding (--no-mtp) in the same
run, on a synthetic llama model with one head (rad-convert --synthetic llama --mtp-layers 1) at TP
1 in process on the host.

No checkpoint of the llama family carries an MTP head, so the head is the synthetic writer's: it
drafts what the model predicts from a token alone (source.py's mtp_specs: its input the token's
normed embedding, its block an identity). What it keeps is that guess's agreement with the model,
not a trained head's; --random gives a head of random weights instead (kept: about none). spechub
is built with cmake into a scratch home and serves the ops (its host rows: reference rows, so
--debug-accept-reference-kernels). Greedy; the tokens must be the plain run's. Reports decode
tokens/s of both, their ratio, and the drafts kept.

    python bench/foreground.py python bench/mtp.py --draft-tokens 1 --tokens 48
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speculative import PROMPTS, spechub, timed_decode  # noqa: E402  (the same prompts and timing, spechub built the same way)


def run(model: Path, home: Path, mtp: bool, k: int, tokens: int) -> dict:
    from radiance.config import Config

    config = Config(model=str(model), radiance_home=str(home), kernels="libr4d,spechub", accept_reference=True,
                    progress=False, mtp=mtp, draft_tokens=k, max_seqs=len(PROMPTS), device="host")
    return timed_decode(config, tokens)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draft-tokens", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--random", action="store_true", help="a head of random weights")
    parser.add_argument("--shape", default="hidden=576,layers=30,heads=9,kv_heads=3,ffn=1536,vocab=49152",
                        help="the synthetic model's options (SmolLM2-135M's shape, its embeddings tied)")
    args = parser.parse_args()
    from radiance.convert.api import convert_synthetic

    shape = {key: int(value) for key, value in (item.split("=") for item in args.shape.split(","))}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        model = folder / "mtp.rad"
        convert_synthetic(model, "llama", {**shape, "mtp_layers": 1, "mtp_random": int(args.random)}, seed=7)
        home = spechub(folder)
        plain = run(model, home, False, args.draft_tokens, args.tokens)
        drafted = run(model, home, True, args.draft_tokens, args.tokens)
    print(json.dumps({
        "model": f"synthetic llama {args.shape} with one MTP head ({'random' if args.random else 'copied'})",
        "draft_tokens": args.draft_tokens, "plain_tokens_per_s": round(plain["tokens_per_s"], 2),
        "mtp_tokens_per_s": round(drafted["tokens_per_s"], 2),
        "ratio": round(drafted["tokens_per_s"] / plain["tokens_per_s"], 3),
        "drafts_kept": f"{drafted['kept']} of {drafted['drafted']}",
        "acceptance": round(drafted["kept"] / max(drafted["drafted"], 1), 3),
        "tokens_equal": plain["outputs"] == drafted["outputs"],
        # a random model's greedy tokens may repeat: how many distinct ones each sequence gave
        "distinct_tokens": [len(set(output)) for output in plain["outputs"]]}, indent=1))


if __name__ == "__main__":
    main()
