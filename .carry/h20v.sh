#!/bin/bash
# h20v (issue 20, serving overhead): run from the repository root after `source bench/card_setup.sh`.
# 1. The sampler's exactness on the card against libref (device/sample.cu now computes the weights and
#    the two scans with every thread, only the running f32 sum stays on one thread, and the key sort
#    runs its passes within 4096-key tiles in shared memory): 40 s at most.
# 2. bench/card_batches.py as issue 20's serving call ran it, now with batch 1 also timed sampled at
#    rad-bench's temperature (0.7), rad-bench counting tokens by the chunks' usage (TTFT/ITL/TPOT
#    measurable on the synthetic model), and the server's own step figures from /metrics: the rest of
#    190 s (its lines are printed as they come, so a timeout still leaves the figures reached).
# Look for: "decode batch 1 ... sampled at temperature 0.7" against the greedy line above it (before
# the fix, a sampled step of the flat synthetic logits cost ~40 ms more: one thread summed 128k
# weights reading random logits), and rad-bench's 1-client TPOT against those (before: 1.63 s per
# 32-token request, ~50 ms a token).
START=$SECONDS
mkdir -p "$OUT/batches"
echo "== sampler card tests (40 s at most)"
timeout 40 python3 -P -m pytest -q -x tests/test_device_rows.py -k "sample" 2>&1 | tail -4 | tee "$OUT/h20v_tests.txt"
LEFT=$((190 - (SECONDS - START)))
echo "== card_batches with serving ($((SECONDS - START)) s in; $LEFT s at most)"
OUT="$OUT/batches" timeout -s INT -k 10 $LEFT python3 bench/card_batches.py --formats bf16 --batches 8 --steps 4 \
    --clients 1,8,32,64 --max-tokens 32 2>&1 | grep -v "^\s*$" | tee "$OUT/h20v_batches.txt" | tail -25
echo "== done in $((SECONDS - START)) s"
