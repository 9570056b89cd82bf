#!/usr/bin/env bash
# FP8 GEMMs under the emulated Hopper accumulator ([fp8] accumulate = "hopper",
# kernels/ops/fp8_accumulation.hpp):
#  - canonical: one model hash on threads, ISAs and dp2 x tp2 with sequence parallelism (promotion
#    intervals never cut), different from fp32 accumulation's; the delayed recipe (and, in the
#    full campaign, e2e/slow/fp8_recipes.sh, the blockwise one);
#  - fast mode and fast tp2 train;
#  - ABFT holds the products to thresholds that include the limited accumulator (no false alarm);
#    sampled reference checks pass; verify step passes a checkpoint bitwise;
#  - errors, once each: an unknown accumulation, a tensor-parallel share or a micro-batch that
#    would cut a promotion interval in canonical mode.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
# d_model 256: each tp2 rank's share of every fp8 linear's reduced features is 128 or more.
write_tp_config 384 256
sed -i 's/^mode = .*/mode = "canonical"\nprecision = "fp8"/' cfg.toml
steps=4
run() { "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --fp8.accumulate=hopper "$@"; }
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$LOCKSTEP" train --config cfg.toml \
  --train.steps=$steps --train.threads=1 --fp8.accumulate=hopper "$@"; }

# The blockwise recipe in the full campaign (e2e/slow/fp8_recipes.sh).
recipes=(delayed)
full_campaign && recipes+=(blockwise)
for recipe in "${recipes[@]}"; do
  "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --fp8.recipe=$recipe > ${recipe}_fp32.log
  run --train.threads=1 --fp8.recipe=$recipe > $recipe.log
  want=$(model_hash $recipe.log)
  [ -n "$want" ] && [ "$want" != "$(model_hash ${recipe}_fp32.log)" ] \
    || fail "$recipe: hopper hash '$want' (fp32 accumulation: $(model_hash ${recipe}_fp32.log))"
  grep -q '^precision: fp8 .*accumulated as on Hopper (e8m13, promoted to fp32 every 128)' $recipe.log \
    || fail "$recipe: no accumulation in the precision line: $(grep '^precision' $recipe.log)"
  run --train.threads=2 --train.isa=avx2 --fp8.recipe=$recipe > ${recipe}_t2.log
  same_hash "$recipe threads 2 avx2" ${recipe}_t2.log "$want"
  mpi 4 --fp8.recipe=$recipe --parallel.dp=2 --parallel.tp=2 --parallel.sp=true > ${recipe}_dp2tp2.log 2>&1 \
    || fail "$recipe dp2 x tp2: $(tail -3 ${recipe}_dp2tp2.log)"
  same_hash "$recipe dp2 x tp2 sp" ${recipe}_dp2tp2.log "$want"
done

run --train.mode=fast > fast.log 2>&1 || fail "fast: $(tail -3 fast.log)"
mpi 2 --train.mode=fast --parallel.tp=2 > fast_tp2.log 2>&1 || fail "fast tp2: $(tail -3 fast_tp2.log)"
for log in fast.log fast_tp2.log; do
  grep -Eq '^done: 4 steps, last loss [0-9.]+' $log || fail "$log: $(tail -2 $log)"
done

# The detectors: ABFT's thresholds and the reference checks' bounds take the accumulator in.
run --verify.abft=true --verify.reference_every=1 > detectors.log 2>&1 || fail "detectors: $(tail -3 detectors.log)"
grep -q '^finding' detectors.log && fail "detectors: $(grep '^finding' detectors.log)"
grep -q '^abft: [1-9][0-9]* products checked on rank 0, 0 failed' detectors.log \
  || fail "abft: $(grep '^abft' detectors.log)"
grep -q '^reference checks: 4 ops re-checked on rank 0' detectors.log \
  || fail "reference checks: $(grep '^reference' detectors.log)"
same_hash "detectors on" detectors.log "$(model_hash delayed.log)"

# verify step: the reference runs the accumulator's model, bit for bit.
run --checkpoint.dir=ck > ck.log
"$LOCKSTEP" verify step --config cfg.toml --fp8.accumulate=hopper --checkpoint ck > verify.log \
  || fail "verify step: $(tail -3 verify.log)"
grep -q '^verify step: PASS' verify.log || fail "verify step: $(tail -1 verify.log)"
grep -Eq '^grad/layer/0/mlp/fc/weight +\[1024,256\] +bitwise ' verify.log \
  || fail "verify step not bitwise: $(grep 'grad/layer/0/mlp/fc/weight' verify.log)"

expect_error "\[fp8\] accumulate: expected \"fp32\" or \"hopper\"" "$LOCKSTEP" train --config cfg.toml --fp8.accumulate=tf32
expect_error "\[fp8\] accumulate = \"hopper\" promotes every 128 tokens of a weight gradient, but the step's 8 micro-batches hold 64 tokens each" \
  "$LOCKSTEP" train --config cfg.toml --fp8.accumulate=hopper --train.micro_batch_size=1
expect_mpi_error "\[fp8\] accumulate = \"hopper\" promotes every 128 elements along layer/0/attn/qkv's output features, but tensor parallelism over 2 ranks gives each rank 64" \
  2 --parallel.tp=2 --model.d_model=128
echo "train_fp8_hopper: canonical hashes $(for r in "${recipes[@]}"; do echo -n "$r $(model_hash $r.log) "; done)on threads, ISAs, dp2 x tp2 sp"
