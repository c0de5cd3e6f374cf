#!/bin/bash
# h20t2 (issue 20): gemm_tma.cu, the TMA + wgmma warp-specialised GEMM (R4D_TC_KERNEL=tma), on one H200.
# Run from the repository root after `source bench/card_setup.sh`; under 280 s. Writes under $OUT:
#   h20t2_cuts.txt, h20t2_gemm.txt, card_prefill_gemm.json, h20t2_tests.txt (, h20t2_prefill.txt, card_batches.json)
OUT=${OUT:-/tmp/h20t2_out}; mkdir -p "$OUT"
SECONDS=0
echo "-- A1: every TMA cut against libref on the card (tails, split K, bf16, fp8 both scalings)"
timeout 80 python3 -P -m pytest -q tests/test_device_batch_rows.py -k tma_cut 2>&1 | tail -12 | tee "$OUT/h20t2_cuts.txt"
echo "-- B: one layer's 8B GEMMs at M = 64 and 2048: torch, gemm_tma.cu (128x128 default, 128x256, 192x256), gemm_wgmma.cu (the default) [${SECONDS}s]"
timeout 125 python3 bench/card_prefill_gemm.py --tokens 64 2048 --kernels tma wgmma --tma-cuts 128,64,3 256,32,5 256,32,4,192 \
    2>&1 | tee "$OUT/h20t2_gemm.txt" | grep -E "^card|M 64 |M 2048|one layer|Error|error|Traceback" | cut -c1-240
LEFT=$((274 - SECONDS)); [ "$LEFT" -gt 90 ] && LEFT=90
if [ "$LEFT" -gt 20 ]; then
    echo "-- A2: the tensor-core GEMM card tests with R4D_TC_KERNEL=tma (the default TMA cut; M 9..300, 2048 sampled) [${SECONDS}s, ${LEFT}s given]"
    R4D_TC_KERNEL=tma timeout $LEFT python3 -P -m pytest -q tests/test_device_batch_rows.py \
        -k "prefill_sized or split_gemm_gives or bf16_tensor_core_gemm or fp8_tensor_core_gemm" 2>&1 | tail -12 | tee "$OUT/h20t2_tests.txt"
fi
if [ "$SECONDS" -lt 150 ]; then
    echo "-- C: a 2048-token prefill through the engine with R4D_TC_KERNEL=tma (batch 8, 4 decode steps) [${SECONDS}s]"
    R4D_TC_KERNEL=tma timeout $((274 - SECONDS)) python3 bench/card_batches.py --formats bf16 --batches 8 --steps 4 \
        --skip-serving 2>&1 | tee "$OUT/h20t2_prefill.txt" | tail -8
else
    echo "-- C skipped (${SECONDS}s spent): the engine's prefill with R4D_TC_KERNEL=tma is for a later call"
fi
echo "-- done in ${SECONDS}s"
