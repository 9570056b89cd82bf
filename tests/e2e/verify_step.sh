#!/usr/bin/env bash
# `lockstep verify step` end to end: a tiny model trained a few steps with checkpoints; the next
# step verified in canonical mode (bitwise against the CanonicalF32 emulation) and in fast mode
# (within Bounded<mpfr> bounds); a one-ulp change of one trainer tensor (--verify.perturb) must
# fail and be named; bad input gives one `error:` line.
source "$(dirname "$0")/lib.sh"
# The canon-ln setup of tests/verify_setups.txt (the base model, its defaults), trained 3 steps.
"$SRC/scripts/verify_setups.sh" --cli "$LOCKSTEP" --work "$WORK" --phase prepare canon-ln > prepare.log 2>&1 \
  || fail "preparing the setup failed: $(tail -3 prepare.log)"
mv canon-ln.toml cfg.toml
mv ck-canon-ln ck
sed -i 's|^dir = .*|dir = "ck"|' cfg.toml
[ -d ck/step_00000002 ] || fail "no checkpoint ck/step_00000002"

"$LOCKSTEP" verify step --config cfg.toml --checkpoint ck/step_00000002 --json canonical.json > canonical.log \
  || fail "canonical verify failed: $(tail -5 canonical.log)"
grep -q '^verify step: PASS' canonical.log || fail "no PASS line: $(tail -3 canonical.log)"
grep -q '"ok": true' canonical.json || fail "JSON report does not say ok"
grep -Eq '^gradient norm [0-9.]+ above grad_clip 1: clipped$' canonical.log \
  || fail "no clipping line: $(grep -m1 '^gradient' canonical.log)"
grep -q '"clipped": true' canonical.json || fail "JSON report does not say the step was clipped"
for row in loss logits grad/logits grad/layer/0/attn/qkv hyper/lr hyper/bias_correction2 grad/wte param/wte optim/v/lnf/bias; do
  grep -Eq "^$row +\[" canonical.log || fail "no row for $row in the canonical report"
done

# Fast mode from the same checkpoint (the root: its newest), within bounds, 256-bit reference.
"$LOCKSTEP" verify step --config cfg.toml --checkpoint ck --train.mode=fast --reference.bits=256 \
  --json fast.json > fast.log || fail "fast verify failed: $(grep -E 'VIOLATION|^verify' fast.log | head -5)"
grep -q '^verify step: PASS' fast.log || fail "no PASS line in fast mode"
grep -q 'Bounded<mpfr' fast.log || fail "fast mode did not use the Bounded reference"

# The Bounded<double> reference passes the same step, and its bounds are the MPFR ones to the
# printed digits (its own roundings add 2^-27 relative).
"$LOCKSTEP" verify step --config cfg.toml --checkpoint ck --train.mode=fast --reference.type=double \
  > fast_double.log || fail "fast verify (double reference) failed: $(grep -E 'VIOLATION|^verify' fast_double.log | head -5)"
grep -q 'Bounded<double' fast_double.log || fail "--reference.type=double did not use Bounded<double>"
diff <(grep -E '^[a-z].* ok$' fast.log | awk '{print $1, $5}') \
     <(grep -E '^[a-z].* ok$' fast_double.log | awk '{print $1, $5}') > bounds.diff \
  || fail "double and MPFR bounds differ: $(head -4 bounds.diff)"

# Probabilistic bounds (--reference.lambda): the step passes them too, their probability is
# printed, and a long reduction's bound is smaller than the worst case's (the weight gradient
# sums over the batch's tokens).
"$LOCKSTEP" verify step --config cfg.toml --checkpoint ck --train.mode=fast --reference.type=double \
  --reference.lambda=6 > fast_lambda.log || fail "probabilistic bounds: $(grep -E 'VIOLATION|^verify' fast_lambda.log | head -5)"
grep -q 'probabilistic bounds (lambda = 6: .* for the longest, n = [0-9]*: 0\.99' fast_lambda.log \
  || fail "no probability printed: $(grep '^verify step' fast_lambda.log)"
worst=$(awk '$1 == "grad/layer/0/mlp/fc/weight" {print $5}' fast_double.log)
prob=$(awk '$1 == "grad/layer/0/mlp/fc/weight" {print $5}' fast_lambda.log)
python3 -c "import sys; sys.exit(0 if 0 < float('$prob') < float('$worst') else 1)" \
  || fail "probabilistic bound $prob not below the worst case $worst"
expect_error "--reference.lambda: expected a positive number" \
  "$LOCKSTEP" verify step --config cfg.toml --checkpoint ck --train.mode=fast --reference.lambda=-1

# --verify.layers keeps the activation rows of layer 1 only.
"$LOCKSTEP" verify step --config cfg.toml --checkpoint ck --verify.layers=1 > layers.log
grep -q '^layer/0/' layers.log && fail "--verify.layers=1 printed layer 0 rows"
grep -q '^layer/1/ln1/out' layers.log || fail "--verify.layers=1 lost layer 1 rows"

# A one-ulp error in one trainer tensor is a violation in canonical mode; in fast mode, where
# the bound allows a few ulps, a flip of mantissa bit 20 (a relative change of about 1/8) is.
# Either is named in the summary, exit 1.
for mode in canonical fast; do
  status=0
  bit=$([ $mode = canonical ] && echo 0 || echo 20)
  "$LOCKSTEP" verify step --config cfg.toml --checkpoint ck --train.mode=$mode \
    --verify.perturb=grad/layer/1/mlp/fc:$bit > perturb_$mode.log || status=$?
  [ "$status" -eq 1 ] || fail "perturbed $mode verify exited $status, expected 1"
  grep -q '^verify step: FAIL.*worst tensor grad/layer/1/mlp/fc' perturb_$mode.log \
    || fail "perturbed $mode verify did not name the tensor: $(tail -1 perturb_$mode.log)"
done

# Too large for the reference under the limit: a clear message with the estimate.
expect_error "estimated at .* s .*--reference.type=double \(estimated .*--verify.force" \
  "$LOCKSTEP" verify step --config cfg.toml --checkpoint ck --train.mode=fast --verify.max_seconds=0.001
expect_error "--reference.type: expected mpfr or double" \
  "$LOCKSTEP" verify step --config cfg.toml --checkpoint ck --reference.type=float
expect_error "no tensor named 'nope'" "$LOCKSTEP" verify step --config cfg.toml --checkpoint ck --verify.perturb=nope
expect_error "layer 7 does not exist" "$LOCKSTEP" verify step --config cfg.toml --checkpoint ck --verify.layers=7
expect_error "\[model\] d_model" "$LOCKSTEP" verify step --config cfg.toml --checkpoint ck --model.d_model=64
echo "verify step: canonical bitwise and fast within bounds; $(tail -1 fast.log)"
