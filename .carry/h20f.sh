#!/bin/bash
# h20f (issue 20): the fp8 decode GEMV converting e4m3 codes on the card (common.cu's r4d_fp8x4) on
# one H200. Run from the repository root after `source bench/card_setup.sh`; at most ~250 s. Writes
# under $OUT: h20f_tests.txt, h20f_batches.txt, card_batches.json, h20f_gemv.txt, device_ops.json
OUT=${OUT:-/tmp/h20f_out}; mkdir -p "$OUT"
echo "-- A: the fp8 GEMV (M 1, 4, 8; both scalings) and the fp8 fused rows on the card against libref"
timeout 65 python3 -P -m pytest -q tests/test_device_batch_rows.py -k "fp8_gemv or fp8_fused" \
    2>&1 | tail -8 | tee "$OUT/h20f_tests.txt"
echo "-- C: the fp8 8B decode at batch 1 and 8 (context 1024) and its kernels; was 4.621 ms/token at batch 1 (34 % of 1.570)"
timeout 140 python3 bench/card_batches.py --formats fp8 --batches 8 --steps 16 --skip-serving --kernels \
    2>&1 | tee "$OUT/h20f_batches.txt" | grep -vE "^\s*$" | cut -c1-200 | tail -60
echo "-- B: fp8 GEMVs at M = 1 chained in a graph: the card's conversion (cvt) against the old bits (R4D_FP8_CVT=0), same run"
timeout 45 python3 bench/device_ops.py --formats fp8_channel --ms 1 --fp8-bits --skip-fused \
    2>&1 | tee "$OUT/h20f_gemv.txt" | grep -E "^card|gemv |Error|error" | cut -c1-160
