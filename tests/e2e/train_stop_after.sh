#!/usr/bin/env bash
# [train] stop_after S: a run configured for N steps executes steps 0..S (the LR schedule of N
# steps), records and checkpoints them as an end of run would, says it stopped early and exits 0.
# Its losses, learning rates and checkpoint equal the first S + 1 steps of the full run, and the
# same command without stop_after continues to the full run's model hash. Values outside
# [0, steps) (other than -1, off) and a stop before the step a run resumes from are refused.
source "$(dirname "$0")/lib.sh"
make_data
write_config
args=(--config cfg.toml --train.steps=6 --train.threads=1 --checkpoint.keep=0 --log.every=1)

"$LOCKSTEP" train "${args[@]}" --checkpoint.dir=full --checkpoint.every=1 --log.metrics=full.jsonl > full.log
"$LOCKSTEP" train "${args[@]}" --checkpoint.dir=part --log.metrics=part.jsonl --train.stop_after=2 > part.log ||
  fail "a run with stop_after did not exit 0: $(tail -3 part.log)"
grep -q '^stopped early: 3 of 6 steps done (\[train\] stop_after = 2' part.log || fail "no early-stop line: $(tail -3 part.log)"
grep -q '^step      6/6' part.log && fail "the stopped run went on past step 2"
[ "$(ls part)" = "step_00000003" ] || fail "expected one checkpoint, part/step_00000003: $(ls part)"
/usr/bin/python3 - full.jsonl part.jsonl <<'PY' || fail "the stopped run's metrics differ from the full run's first 3 steps"
import json, sys
full, part = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
assert [r["step"] for r in part] == [1, 2, 3], [r["step"] for r in part]
for a, b in zip(part, full):
    assert (a["step"], a["loss"], a["lr"], a["grad_norm"]) == (b["step"], b["loss"], b["lr"], b["grad_norm"]), (a, b)
PY
for s in 1 2 3; do  # the console's loss lines, from the step count to the learning rate
  want=$(grep "^step      $s/6 " full.log | cut -d'|' -f1-3)
  [ "$(grep "^step      $s/6 " part.log | cut -d'|' -f1-3)" = "$want" ] || fail "step $s line differs: $want"
done
"$LOCKSTEP" ckpt info full/step_00000003 > full3.info
"$LOCKSTEP" ckpt info part > part.info
[ "$(model_hash part.info)" = "$(model_hash full3.info)" ] || fail "checkpoint after the stop != the full run's step 3"

# Without stop_after the same command resumes and ends where the full run ends.
"$LOCKSTEP" train "${args[@]}" --checkpoint.dir=part --log.metrics=part.jsonl > rest.log
grep -q '^resumed from .*step_00000003' rest.log || fail "did not resume from step 3: $(head -3 rest.log)"
[ "$(model_hash rest.log)" = "$(model_hash full.log)" ] || fail "resumed run's hash != the full run's"

expect_error 'cfg.toml: \[train\] stop_after \(6\) must be a 0-based step of the run, 0 <= stop_after < steps \(6\)' \
  "$LOCKSTEP" train "${args[@]}" --train.stop_after=6
expect_error 'cfg.toml: \[train\] stop_after \(-2\) must be' "$LOCKSTEP" train "${args[@]}" --train.stop_after=-2
expect_error 'cfg.toml: \[train\] stop_after \(1\) is a step before the one this run resumes from \(6' \
  "$LOCKSTEP" train "${args[@]}" --checkpoint.dir=part --train.stop_after=1
echo "train_stop_after: stop_after 2 of 6 = the full run's first 3 steps (losses, checkpoint); resumes to its hash; bad values refused"
