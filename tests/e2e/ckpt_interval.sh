#!/usr/bin/env bash
# [checkpoint] every = "auto": the run saves after its first step to measure what a save costs, then
# at the interval Daly's formula gives for that stall, its mean step time and [checkpoint]
# mtbf_hours — the same on every rank (rank 0's measurement), printed when it is set — and the last
# step as always. A value that is neither an integer nor "auto" is one error line.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
# A mean time between failures of 0.36 s keeps the interval at a few steps of this small model.
mpirun --oversubscribe -np 2 "$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=30 --parallel.dp=2 \
  --checkpoint.dir=ck --checkpoint.keep=0 --checkpoint.every=auto --checkpoint.mtbf_hours=0.0001 > run.log 2>&1 ||
  fail "training: $(tail -3 run.log)"
grep -q '^checkpoint ck/step_00000001 ' run.log || fail "no measuring save after step 1: $(grep '^checkpoint' run.log | head -3)"
grep -q "^checkpoint interval: every [0-9]* steps\? (Daly's optimum for a save stall of [0-9.e-]* s, a mean time between failures of 0.0001 h" run.log ||
  fail "no interval line: $(grep '^checkpoint interval' run.log)"
/usr/bin/python3 - run.log <<'PY' || fail "checkpoints not at the printed interval: $(grep '^checkpoint' run.log)"
import re, sys
lines = open(sys.argv[1]).read().splitlines()
saved = [int(m.group(1)) for l in lines if (m := re.match(r"checkpoint ck/step_(\d+) ", l))]
every = [int(m.group(1)) for l in lines if (m := re.match(r"checkpoint interval: every (\d+) step", l))]
assert saved[0] == 1 and saved[-1] == 30 and every, (saved, every)
# Between saves, the interval in force (the last one printed before), or the end of the run.
assert len(saved) >= 3, saved
assert all(b - a >= 1 for a, b in zip(saved, saved[1:])), saved
assert all(b - a <= max(every) for a, b in zip(saved, saved[1:])), (saved, every)
print(saved, every)
PY
"$LOCKSTEP" ckpt verify ck > verify.log || fail "the automatic checkpoints do not verify: $(tail -3 verify.log)"
{ cat cfg.toml; printf '\n[checkpoint]\nevery = "often"\n'; } > bad.toml
expect_error 'bad.toml: \[checkpoint\] every: expected an integer or "auto"' "$LOCKSTEP" train --config bad.toml
expect_error 'cfg.toml: \[checkpoint\] mtbf_hours must be a positive number of hours' \
  "$LOCKSTEP" train --config cfg.toml --checkpoint.mtbf_hours=0
echo PASS
