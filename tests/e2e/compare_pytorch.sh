#!/usr/bin/env bash
# scripts/compare_pytorch.sh end to end on bench_small, shortened (1 thread, one round, one timed
# step): PyTorch (python3-torch, installed by scripts/test.sh) rebuilds the model from Lockstep's
# safetensors export and trains on the batches of `lockstep bench --tokens-out`; the script must
# report both throughputs with their GEMMs (OpenBLAS kernels), and the step-1 losses of Lockstep
# (fast and canonical) and PyTorch must lie within the derived bound of the fp64 loss (the script
# exits 1 otherwise). No timing is asserted, and the machine's OPENBLAS_CORETYPE is kept
# (COMPARE_CORETYPE).
source "$(dirname "$0")/lib.sh"

LOCKSTEP="$LOCKSTEP" COMPARE_CORETYPE=machine COMPARE_THREADS=1 COMPARE_ROUNDS=1 "$SRC/scripts/compare_pytorch.sh" bench_small 1 > compare.log 2>&1 \
  || fail "compare_pytorch.sh failed: $(cat compare.log)"
grep -Eq '^threads 1: Lockstep fast fp32 [0-9]+ tokens/s \((OpenBLAS sgemm \([A-Za-z0-9]+\)|Lockstep fast GEMM \([^)]+\)), .*PyTorch [0-9]+ tokens/s \((pthread|openmp) OpenBLAS [A-Za-z0-9]+, .*Lockstep / PyTorch = [0-9.]+' compare.log \
  || fail "no throughput line: $(cat compare.log)"
for side in "Lockstep fast" "Lockstep canonical" "PyTorch fp32"; do
  grep -Eq "^  $side +[0-9.]+ +\|diff\| .* ok$" compare.log || fail "no checked step-1 loss for $side: $(cat compare.log)"
done
grep -q "EXCEEDS" compare.log && fail "a loss exceeds its bound: $(cat compare.log)"
echo "compare_pytorch: ok"
