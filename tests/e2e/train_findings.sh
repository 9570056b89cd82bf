#!/usr/bin/env bash
# The detectors while training (verify/detect/), end to end from the CLI:
#  - a clean run has no finding;
#  - a parameter's exponent bit flipped after step 20's update (the embedding of 'a', a token of
#    the data, 256 times larger) is memory corruption at rest: found before step 21 uses it (exit 6);
#  - a run resumed at step 20 with a learning rate of 3 (instead of 1e-3) blows up: its gradient
#    norm at step 22 and its loss at step 23 are spikes against the history from before the restart
#    (kept in the checkpoint; without it the window would hold too few values to judge): a finding line naming the detector, the
#    site and the step, a JSONL record, and the run goes on ([verify] on_spike = "warn", the
#    default); with on_spike = "stop" it ends there with exit 7 and says why, its last checkpoint
#    the one before the finding;
#  - a flip of the exponent's top bit (an embedding row 2^128 times larger, which the tied head turns
#    into logits of 10^35) makes step 22's gradient norm non-finite: exit 7 by default (on_fault =
#    "stop"), one finding line; with on_fault = "warn" the run goes to its end;
#  - the lowest bit of one AdamW second moment flipped after step 5's update (memory corruption at
#    rest) is found before step 6 uses it: exit 6, the buffer named.
source "$(dirname "$0")/lib.sh"
make_data
write_config
run() { "$LOCKSTEP" train --config cfg.toml --train.steps=30 --log.every=1 --log.metrics=m.jsonl "$@"; }

run > clean.log 2>&1 || fail "clean run: $(tail -3 clean.log)"
grep -q '^finding' clean.log && fail "a clean run reported: $(grep '^finding' clean.log)"

flip="--inject.site=param/wte --inject.kind=bitflip:bit=26,index=6210 --inject.step=20"
status=0
run $flip > at_rest_param.log 2>&1 || status=$?
[ "$status" -eq 6 ] || fail "parameter flipped at rest: expected exit 6, got $status: $(tail -3 at_rest_param.log)"
grep -q '^finding: after step 21, detector state_at_rest, site parameters' at_rest_param.log \
  || fail "no state-at-rest finding for the parameter: $(grep '^finding' at_rest_param.log)"

"$LOCKSTEP" train --config cfg.toml --train.steps=30 --train.stop_after=19 --checkpoint.dir=ck \
  --checkpoint.every=20 > first20.log 2>&1 || fail "first 20 steps: $(tail -3 first20.log)"
cp -r ck ck_stop
run --checkpoint.dir=ck --train.lr=3.0 > spike.log 2>&1 || fail "spike run (warn): $(tail -3 spike.log)"
grep -q '^resumed from ck/step_00000020' spike.log || fail "did not resume: $(head -3 spike.log)"
# The gradient norm jumps first (step 22), the loss a step later.
grep -Eq '^finding: after step 22, detector spike, site grad_norm, ranks all: robust z [0-9.e+]+ against bound 20 \(spike\)' \
  spike.log || fail "no gradient-norm spike finding at step 22: $(grep -E '^(finding|step +2[1-4])' spike.log)"
grep -Eq '^finding: after step 23, detector spike, site loss, ranks all: robust z [0-9.e+]+ against bound 6 \(spike\)' spike.log \
  || fail "no loss spike finding at step 23: $(grep -E '^(finding|step +2[1-4])' spike.log)"
grep -q '^done: 30 steps' spike.log || fail "the warned run did not finish"
grep -q '"finding":{.*"detector":"spike"' m.jsonl || fail "no finding record in the metrics"

status=0
run --checkpoint.dir=ck_stop --train.lr=3.0 --verify.on_spike=stop --checkpoint.every=2 > spike_stop.log 2>&1 || status=$?
[ "$status" -eq 7 ] || fail "spike with on_spike=stop: expected exit 7, got $status: $(tail -3 spike_stop.log)"
grep -q 'stopped after step 22 on the spike finding at grad_norm (\[verify\] on_spike = "stop"' spike_stop.log \
  || fail "no reason for the stop: $(tail -2 spike_stop.log)"
[ -d ck_stop/step_00000020 ] && [ ! -d ck_stop/step_00000022 ] || fail "checkpoints: $(ls ck_stop)"

status=0
inf="--inject.site=param/wte --inject.kind=bitflip:bit=30,index=700 --inject.step=20 --verify.state_at_rest=false"
run $inf > nonfinite.log 2>&1 || status=$?
[ "$status" -eq 7 ] || fail "non-finite: expected exit 7, got $status: $(tail -3 nonfinite.log)"
[ "$(grep -c '^finding:' nonfinite.log)" -eq 1 ] || fail "expected one finding: $(grep '^finding' nonfinite.log)"
grep -Eq '^finding: after step 22, detector nonfinite, site (loss|grad_norm)' nonfinite.log \
  || fail "no non-finite finding at step 22: $(grep '^finding' nonfinite.log)"
run $inf --verify.on_fault=warn > nonfinite_warn.log 2>&1 || fail "non-finite with warn: $(tail -3 nonfinite_warn.log)"
grep -q '^done: 30 steps' nonfinite_warn.log || fail "the warned non-finite run did not finish"

status=0
run --inject.site=optim/v --inject.kind=bitflip:bit=0,index=1234 --inject.step=5 > at_rest.log 2>&1 || status=$?
[ "$status" -eq 6 ] || fail "moment flipped at rest: expected exit 6, got $status: $(tail -3 at_rest.log)"
grep -q '^finding: after step 6, detector state_at_rest, site optim/v, ranks 0: ranks 1 against bound 0 (corruption)' \
  at_rest.log || fail "no state-at-rest finding: $(grep '^finding' at_rest.log)"
run --inject.site=optim/v --inject.kind=bitflip:bit=0,index=1234 --inject.step=5 --verify.state_at_rest=false \
  > at_rest_off.log 2>&1 || fail "with the check off the run goes on: $(tail -3 at_rest_off.log)"
