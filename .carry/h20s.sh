#!/bin/bash
# h20s (issue 20): the streamed GEMM of batched decode (gemm_streamed.cu) on one H200. Run from the
# repository root after `source bench/card_setup.sh`; about 280 s. Writes under $OUT:
#   h20s_tests.txt, h20s_gemm.txt, card_prefill_gemm.json, h20s_batches.txt, card_batches.json
OUT=${OUT:-/tmp/h20s_out}; mkdir -p "$OUT"
echo "-- A: the streamed GEMM's card tests (real card rows against libref; fake card and nvrtc)"
timeout 50 python3 -P -m pytest -q tests/test_device_batch_rows.py tests/test_device_tensor_cores.py -k streamed \
    2>&1 | tail -15 | tee "$OUT/h20s_tests.txt"
echo "-- B: one layer's 8B GEMMs + lm head at M = 16, 32, 64 (and k/v alone): torch, the tile GEMM (default), the streamed GEMM's cuts"
timeout 130 python3 bench/card_prefill_gemm.py --tokens 16 32 64 --lm-head --streamed 1 8,2,64,4 8,2,64,1,2 \
    2>&1 | tee "$OUT/h20s_gemm.txt" | grep -E "^card|M 16 |M 32 |M 64 |one layer|Error|error"
echo "-- C: batched decode with the streamed GEMM on (R4D_STREAMED_GEMM=1); batch 8 is the GEMV, unchanged"
R4D_STREAMED_GEMM=1 timeout 110 python3 bench/card_batches.py --formats bf16 --batches 8 32 64 --steps 16 --skip-serving \
    2>&1 | tee "$OUT/h20s_batches.txt" | tail -12
