#!/usr/bin/env bash
# [train] kernel_cache: a run that measures its GEMM peak (no peak_gflops) keeps the measurement in
# the cache file and the next run on the same machine, build, threads and ranks reads it back
# instead of measuring; every rank of a multi-rank run then holds rank 0's figures. A malformed
# cache file is named in the start-up line and measured over, never stopping the run; "off" always
# measures; an empty setting is one error line.
source "$(dirname "$0")/lib.sh"
make_data
write_config
sed -i '/^peak_gflops/d' cfg.toml
args=(--config cfg.toml --train.steps=2 --train.threads=1 --log.every=1)

"$LOCKSTEP" train "${args[@]}" --train.kernel_cache="$WORK/k.json" > first.log
grep -q "^kernels: .*(measured now; cached in $WORK/k.json)" first.log || fail "first run: $(grep '^kernels' first.log)"
grep -q '; 1 rank"' k.json || fail "no one-rank entry in k.json: $(cat k.json)"
"$LOCKSTEP" train "${args[@]}" --train.kernel_cache="$WORK/k.json" > second.log
grep -q "^kernels: .*(from the cache $WORK/k.json, measured 20" second.log || fail "second run: $(grep '^kernels' second.log)"
# The same figures, so the same kernels and the same peak MFU is reported against.
[ "$(grep '^model: ' first.log | sed 's/.*MFU against//')" = "$(grep '^model: ' second.log | sed 's/.*MFU against//')" ] ||
  fail "the cached peak differs from the measured one"
[ "$(model_hash first.log)" = "$(model_hash second.log)" ] || fail "reading the cache changed the model"

# Two ranks are another key: measured by both, then read back by rank 0 and shared.
mpi() { mpirun --oversubscribe -np 2 "$LOCKSTEP" train "${args[@]}" --parallel.dp=2 --parallel.timeout_s=60 "$@"; }
mpi --train.kernel_cache="$WORK/k.json" > mpi1.log
grep -q "^kernels: .*(measured now by every rank, highest figures kept; cached in $WORK/k.json)" mpi1.log ||
  fail "two ranks, first run: $(grep '^kernels' mpi1.log)"
mpi --train.kernel_cache="$WORK/k.json" > mpi2.log
grep -q "^kernels: .*(from the cache $WORK/k.json" mpi2.log || fail "two ranks, second run: $(grep '^kernels' mpi2.log)"
grep -q '; 2 ranks"' k.json && grep -q '; 1 rank"' k.json || fail "k.json lost an entry: $(cat k.json)"

# A malformed cache: named, measured over, rewritten; the run ends normally.
echo '{"version": 1, "build": ' > k.json
"$LOCKSTEP" train "${args[@]}" --train.kernel_cache="$WORK/k.json" > bad.log ||
  fail "a malformed cache stopped the run: $(tail -3 bad.log)"
grep -q "^kernels: .*measured now; cached in $WORK/k.json; the cache was not used: $WORK/k.json: not a kernel cache" bad.log ||
  fail "malformed cache: $(grep '^kernels' bad.log)"
"$LOCKSTEP" train "${args[@]}" --train.kernel_cache="$WORK/k.json" > fixed.log
grep -q "^kernels: .*(from the cache" fixed.log || fail "the malformed cache was not replaced: $(grep '^kernels' fixed.log)"

"$LOCKSTEP" train "${args[@]}" --train.kernel_cache=off > off.log
grep -q "^kernels: .*(measured now; \[train\] kernel_cache is off)" off.log || fail "off: $(grep '^kernels' off.log)"
expect_error 'cfg.toml: \[train\] kernel_cache: expected "auto", "off" or a file path, got ""' \
  "$LOCKSTEP" train "${args[@]}" --train.kernel_cache=
echo "PASS"
