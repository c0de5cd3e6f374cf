"""radiance-launch on a machine with cards: which cards it sees, each rank pinned to the card it was
given (checked by PCI bus id, with the user's CUDA_VISIBLE_DEVICES naming cards out of order), the
P2P fact measured through IPC handles, and TP generation on card ranks.

    python3 bench/card_launch.py [--order 3,1]   # on the lent machine; radiance need not be installed

`--order` is the user's CUDA_VISIBLE_DEVICES, cards named out of order (default: on four or more
cards 3,1, else the two first reversed); rank r must report the PCI bus id of the r-th card named.
Two launches: with --disable-p2p (the collectives' _host twins, staged through pinned shared memory)
and with P2P as measured. Card ranks run libr4d's device rows. Results go to $OUT/card_launch.json
when $OUT is set."""

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkout_shim  # noqa: E402,F401  (maps the checkout under `radiance.`, here and in children)

from radiance.launch.devices import visible_cards  # noqa: E402


def launch(model: Path, environ: dict, *extra) -> dict:
    tp = str(len(environ["CUDA_VISIBLE_DEVICES"].split(",")))
    command = [sys.executable, "-m", "radiance.tools.launch", "--tp", tp, "--model", str(model), "--prompt",
               "hello there", "--max-tokens", "8", "--temperature", "0", *extra]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **environ},
                          cwd=tempfile.gettempdir(), timeout=240)
    placed = dict(re.findall(r"rank (\d+): .* at PCI (\S+)", done.stderr))
    return {"exit": done.returncode, "stdout": done.stdout, "stderr_tail": done.stderr.splitlines()[-8:],
            "rank_bus_ids": placed}


def main() -> None:
    import argparse

    from radiance.convert.api import convert_synthetic

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--order", default=None, help="CUDA_VISIBLE_DEVICES to launch with, e.g. 3,1")
    options = parser.parse_args()
    cards = visible_cards()
    results = {"cards": [{"index": c.index, "bus_id": c.bus_id, "uuid": c.uuid} for c in cards]}
    print("visible cards:", results["cards"])
    model = Path(tempfile.mkdtemp()) / "tiny.rad"
    convert_synthetic(model, "llama", dict(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=320,
                                        context=256), seed=7)
    if len(cards) >= 2:
        by_index = {str(c.index): c for c in cards}
        order = options.order or ("3,1" if len(cards) >= 4 else f"{cards[1].index},{cards[0].index}")
        named = order.split(",")
        results["order"] = order
        results["pinned_out_of_order"] = launch(model, {"CUDA_VISIBLE_DEVICES": order}, "--disable-p2p")
        expected = {str(r): by_index[i].bus_id for r, i in enumerate(named)}
        results["pinned_out_of_order"]["expected_bus_ids"] = expected
        results["pinned_out_of_order"]["each_rank_on_its_card"] = results["pinned_out_of_order"]["rank_bus_ids"] == expected
        results["with_p2p"] = launch(model, {"CUDA_VISIBLE_DEVICES": order})
    print(json.dumps(results, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "card_launch.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
