#!/bin/bash
# h20a: decode attention for batches (attention_decode.cu) on one H200. Run from the checkout's root
# after `source bench/card_setup.sh`. Under 280 s: card tests against libref (<= 80 s), the kernel's
# bench against the bound, the tiles, attention.cu and torch (<= 75 s), the engine's batched decode (the rest).
set -o pipefail
mkdir -p "$OUT"
T0=$(date +%s)
echo "== 1. card tests: decode steps of the batch attention row (batch 1/8/33/64, contexts 1..8191, mixed) and of the fused rope_attention row, against libref"
timeout 80 python3 -P -m pytest -q -p no:cacheprovider tests/test_device_rows.py tests/test_device_batch_rows.py \
    -k "attention or decode" 2>&1 | tee "$OUT/h20a_tests.txt" | tail -8
echo "== 1 done after $(( $(date +%s) - T0 )) s"
echo "== 2. bench: r4d_attend_decode alone, us a layer, TB/s of its f32 KV bytes; against the tiles, attention.cu (fused, batch <= 8) and torch sdpa bf16"
timeout 75 python3 bench/card_decode_attention.py --sweep 2>&1 | tee "$OUT/h20a_decode_attention.txt" | tail -45
echo "== 2 done after $(( $(date +%s) - T0 )) s"
echo "== 3. engine: batched decode at 8/32/64, mixed contexts 64..1024 (every decode step's attention on attention_decode.cu)"
timeout $(( 275 - ($(date +%s) - T0) )) python3 bench/card_batches.py --formats bf16 --batches 8 32 64 --steps 8 \
    --skip-serving --mixed 2>&1 | grep -v "^      #" | tee "$OUT/h20a_batches.txt" | tail -12
echo "== 3 done after $(( $(date +%s) - T0 )) s"
