#!/bin/bash
# h20t2 (issue 20): gemm_tma.cu, the TMA + wgmma warp-specialised GEMM (R4D_TC_KERNEL=tma), on one H200.
# Run from the repository root after `source bench/card_setup.sh`; under 280 s. Writes under $OUT:
#   h20t2_tests.txt, h20t2_gemm.txt, card_prefill_gemm.json, h20t2_prefill.txt, card_batches.json
OUT=${OUT:-/tmp/h20t2_out}; mkdir -p "$OUT"
SECONDS=0
echo "-- A: gemm_tma.cu's card tests against libref (every TMA cut; then the tensor-core GEMM tests with R4D_TC_KERNEL=tma)"
R4D_TC_KERNEL=tma timeout 100 python3 -P -m pytest -q tests/test_device_batch_rows.py \
    -k "tma_cut or bf16_tensor_core_gemm or fp8_tensor_core_gemm or prefill_sized or split_gemm_gives" \
    2>&1 | tail -25 | tee "$OUT/h20t2_tests.txt"
echo "-- B: one layer's 8B GEMMs at M = 64 and 2048: torch, gemm_tma.cu in its three cuts, gemm_wgmma.cu (the default) [${SECONDS}s]"
timeout 120 python3 bench/card_prefill_gemm.py --tokens 64 2048 --kernels tma wgmma --tma-cuts all \
    2>&1 | tee "$OUT/h20t2_gemm.txt" | grep -E "^card|M 64 |M 2048|one layer|blocks a|Error|error|Traceback" | cut -c1-260
if [ "$SECONDS" -lt 160 ]; then
    echo "-- C: a 2048-token prefill through the engine with R4D_TC_KERNEL=tma (batch 8 decode, 4 steps) [${SECONDS}s]"
    R4D_TC_KERNEL=tma timeout $((272 - SECONDS)) python3 bench/card_batches.py --formats bf16 --batches 8 --steps 4 \
        --skip-serving 2>&1 | tee "$OUT/h20t2_prefill.txt" | tail -8
else
    echo "-- C skipped: ${SECONDS}s spent"
fi
echo "-- done in ${SECONDS}s"
