"""bench/allreduce_fused.py runs to its end on fake cards (its checks exact, its table written), so its
first run on a card spends the card's time on the figures, not on the script's own mistakes."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_bench_runs_its_checks_on_fake_cards(tmp_path):
    environment = {**os.environ, "OUT": str(tmp_path), "RADIANCE_KERNEL_CACHE": str(tmp_path / "kernels"),
                   "RADIANCE_TEST_FAKE_KERNELS": str(ROOT / "tests" / "fixtures" / "fakecard.py")}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "allreduce_fused.py"), "--largest", str(256 << 10), "--ranks", "2"],
                          capture_output=True, text=True, timeout=900, env=environment, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "allreduce_fused.json").read_text())
    rows = results["rows"]
    assert sorted(int(size) for size in rows) == [8192 << i for i in range(6)]   # 8 KiB .. 256 KiB
    for size, row in rows.items():
        assert row["checks"] and all(row["checks"].values()), (size, row["checks"])
        assert {"all_reduce f32 ll", "fused f32 ll", "fused bf16 rows", "chain f32"} <= set(row["us"]), row["us"]
        assert row["picked"] == ("ll" if int(size) <= 128 << 10 else "one_shot")
    assert "all exact" in done.stdout and "FAILED" not in done.stdout
