#!/bin/bash
# h20b: the decode band at M = 2..8 (bf16, Hopper) on gemm_skinny.cu's band entry (device_skinny_band.py), one
# H200. Run from the checkout's root after `source bench/card_setup.sh`. About 200 s: the card tests of the rows
# the band now serves, against libref (<= 30 s; they compile the band's kernels, which the rest then finds in the
# compile cache), the bench of one 8B layer's fused rows and the lm head, gemv.cu against the band in the same run
# (<= 50 s), then the engine's batch-8 step against the compiled peer (the rest, at least 120 s).
set -o pipefail
mkdir -p "$OUT"
T0=$(date +%s)
echo "== 1. card tests against libref (on the band): the bf16 GEMV at M = 4 (five 8B shapes), rmsnorm + q, k, v and rmsnorm + gate, up at M = 3, 8, gemm_add at M = 8, a split GEMV's replays at M = 2, the lm head at M = 4 (greedy and drawn rows)"
timeout 30 python3 -P -m pytest -q -p no:cacheprovider tests/test_device_rows.py \
    -k "gate_up[3-llama8b] or gate_up[8-llama8b] or llama8b_bf16[4- or gemm_add[8-bf16 or split_k_gemv and bf16 or lm_head and bf16" \
    2>&1 | tee "$OUT/h20b_tests.txt" | tail -6
echo "== 1 done after $(( $(date +%s) - T0 )) s"
echo "== 2. bench: one 8B layer's fused rows + the lm head at M = 8, 4, 2: gemv.cu vs the skinny band (us, % of 4.8 TB/s)"
timeout 50 python3 bench/card_band.py --ms 8 4 2 --check-ms 2>&1 | tee "$OUT/h20b_band.txt" | grep -E "M=|LAYER|card|Error|error|seconds" | tail -24
echo "== 2 done after $(( $(date +%s) - T0 )) s"
echo "== 3. engine: batch 8 at context 1024, then the compiled peer (gpt-fast's recipe) in the same run"
LEFT=$(( 200 - ($(date +%s) - T0) ))
timeout $(( LEFT > 120 ? LEFT : 120 )) python3 bench/card_batches.py --formats bf16 --batches 8 --steps 16 --skip-serving \
    --peer decode 2>&1 | grep -v "^      #" | tee "$OUT/h20b_batches.txt" | grep -E "decode batch|batch 1:|prefill 2048|PyTorch|written in|Error|error" | tail -12
echo "== 3 done after $(( $(date +%s) - T0 )) s"
