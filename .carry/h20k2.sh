#!/bin/bash
# h20k, second call (optional, after .carry/h20k.sh's figures): the skinny kernel below its default band and
# in the engine with the cut the first call found best. Run from the repository root after
# `source bench/card_setup.sh`; under 280 s. CUT=warpgroups,k_bytes[,blocks] (default 1,128) picks the
# skinny cut for C. Writes under $OUT: h20k2_small.txt, card_prefill_gemm.json, h20k2_batches.txt, card_batches.json
OUT=${OUT:-/tmp/h20k2_out}; mkdir -p "$OUT"
CUT=${CUT:-1,128}
SECONDS=0
echo "-- B2: M = 8, 16, 32: the decode GEMV (M 8), the skinny kernel (every cut), the streamed GEMM, torch"
timeout 110 python3 bench/card_prefill_gemm.py --tokens 8 16 32 --kernels skinny --skinny-cuts all --streamed 1 --gemv \
    > "$OUT/h20k2_small.txt" 2>&1
grep -E "one layer|OUTSIDE|Error|Traceback" "$OUT/h20k2_small.txt" | cut -c1-200
python3 - "$OUT/h20k2_small.txt" <<'PY'
import re, sys
for line in open(sys.argv[1]):
    m = re.match(r"\s+(\S+) \S+\s+M (\d+)\s+(?:bf16\s+(.*?)\s+radiance|torch bf16)\s+([\d.]+) us.*?([\d.]+) TB/s", line)
    if m:
        x = re.search(r"at ([\d.]+)x torch", line)
        print(f"{m[1]:8} M {m[2]:>3} {m[3] or 'torch':18} {float(m[4]):8.1f} us {m[5]} TB/s" + (f" {x[1]}x" if x else ""))
PY
LEFT=$((276 - SECONDS))
echo "-- C2: batched decode 64 / 32 with R4D_SKINNY_CUT=$CUT and R4D_STREAMED_GEMM=0 (skinny at every M 9..128) [${SECONDS}s, ${LEFT}s given]"
if [ "$LEFT" -gt 40 ]; then
    R4D_SKINNY_CUT=$CUT R4D_STREAMED_GEMM=0 timeout -s INT $LEFT python3 bench/card_batches.py --formats bf16 --batches 64 32 \
        --steps 8 --skip-serving 2>&1 | grep -v "^      #" | tee "$OUT/h20k2_batches.txt" | tail -10
fi
echo "-- done in ${SECONDS}s"
