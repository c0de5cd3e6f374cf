#!/bin/bash
# h20k (issue 20): gemm_skinny.cu, the swap-AB wgmma GEMM of batched decode's few rows (M 9..128 on an
# sm_90, bf16), on one H200. Run from the repository root after `source bench/card_setup.sh`; under 280 s.
# Writes under $OUT: h20k_tests.txt, h20k_gemm.txt, card_prefill_gemm.json, h20k_batches.txt, card_batches.json
# (and h20k_gemv.txt where time is left: M = 8, the GEMV against the skinny kernel)
OUT=${OUT:-/tmp/h20k_out}; mkdir -p "$OUT"
SECONDS=0
echo "-- A: the skinny kernel against libref on the card (M 9, 17, 33, 64, 100, 128; N 1000 and 576 tails; K split"
echo "   and not; three cuts), then the tensor-core GEMM card tests with R4D_TC_KERNEL=skinny (M 9..300, split replays)"
R4D_TC_KERNEL=skinny timeout 45 python3 -P -m pytest -q -p no:cacheprovider tests/test_gemm_skinny.py tests/test_device_batch_rows.py \
    -k "on_a_card or split_gemm_gives or bf16_tensor_core_gemm" 2>&1 | tail -15 | tee "$OUT/h20k_tests.txt"
echo "-- B: a layer's 8B GEMMs (and k/v's 1024 rows) at M = 16, 32, 64, 128: torch (cuBLAS), skinny (its three cuts), wgmma, tma [${SECONDS}s]"
timeout 115 python3 bench/card_prefill_gemm.py --tokens 16 32 64 128 --kernels skinny wgmma tma --skinny-cuts all \
    > "$OUT/h20k_gemm.txt" 2>&1
grep -E "^card|one layer|blocks a multi|OUTSIDE|Error|error|Traceback" "$OUT/h20k_gemm.txt" | cut -c1-200
# every case in one short line: shape, M, kernel, us, weight TB/s, splits, error, speed against torch
python3 - "$OUT/h20k_gemm.txt" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    m = re.match(r"\s+(\S+) \S+\s+M (\d+)\s+(?:bf16\s+(.*?)\s+radiance|torch bf16)\s+([\d.]+) us.*?([\d.]+) TB/s", line)
    if m:
        splits = re.search(r"(\d+) split", line); err = re.search(r"err ([\d.e+-]+)", line); x = re.search(r"at ([\d.]+)x torch", line)
        print(f"{m[1]:8} M {m[2]:>3} {m[3] or 'torch':18} {float(m[4]):8.1f} us {m[5]} TB/s" + (f" {splits[1]:>2}sp err {err[1]}" if splits else "")
              + (f" {x[1]}x" if x else ""))
PY
LEFT=$((276 - SECONDS)); [ "$LEFT" -gt 130 ] && LEFT=130
echo "-- C: the engine's batched decode, bf16 8B, batch 64 / 32 / 8 (skinny by default at M 33..128) [${SECONDS}s, ${LEFT}s given]"
if [ "$LEFT" -gt 40 ]; then
    timeout -s INT $LEFT python3 bench/card_batches.py --formats bf16 --batches 64 32 8 --steps 8 --skip-serving \
        2>&1 | grep -v "^      #" | tee "$OUT/h20k_batches.txt" | tail -14
fi
if [ "$SECONDS" -lt 240 ]; then
    echo "-- D: M = 8 (the GEMV band): the decode GEMV row against the skinny kernel (SK_MX 8), a layer's GEMMs [${SECONDS}s]"
    mkdir -p /tmp/h20k_gemv; OUT=/tmp/h20k_gemv timeout $((276 - SECONDS)) python3 bench/card_prefill_gemm.py --tokens 8 --kernels skinny --gemv \
        > "$OUT/h20k_gemv.txt" 2>&1  # its JSON apart: B's stays
    grep -E "one layer|OUTSIDE|Error|Traceback" "$OUT/h20k_gemv.txt" | cut -c1-200
fi
echo "-- done in ${SECONDS}s"
