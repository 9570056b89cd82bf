#!/usr/bin/env bash
# lockstep launch --spares: a 4-rank job (dp2 x tp2) with one spare process, whose process 2 is slow
# on every step ([inject] kind slow on launcher rank 2, persistent: a throttled device). The
# straggler detector names rank 2 and, with [verify] on_straggler = "stop", the job checkpoints and
# ends with exit 9; the supervisor moves rank 2 to the spare process 4 and restarts; the job resumes
# on processes 0,1,4,3 without a finding and ends on the model hash of an uninterrupted clean run
# (canonical). A persistent fault's rank moves to the spare the same way. Without a spare the slow
# rank's stop is not restarted; a malformed process list is one error line.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_tp_config 384 128
train=("$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=40 --parallel.dp=2 --parallel.tp=2
  --parallel.timeout_s=60 --verify.straggler_window=5 --verify.straggler_patience=2)
slow=(--inject.kind=slow:ms=40 --inject.rank=2 --inject.step=0 --inject.persistent=true --verify.on_straggler=stop)
mpirun --oversubscribe -np 4 "${train[@]}" > clean.log 2>&1 || fail "clean run: $(tail -3 clean.log)"
want=$(model_hash clean.log)
[ -n "$want" ] || fail "no model hash: $(tail -3 clean.log)"

# The job's ranks on other processes give the same model: process 4 as rank 2, process 2 standing by.
LOCKSTEP_ACTIVE_RANKS=0,1,4,3 mpirun --oversubscribe -np 5 -x LOCKSTEP_ACTIVE_RANKS "${train[@]}" > moved.log 2>&1 ||
  fail "ranks on processes 0,1,4,3: $(tail -3 moved.log)"
[ "$(model_hash moved.log)" = "$want" ] || fail "ranks on other processes changed the model: $(model_hash moved.log) != $want"

"$LOCKSTEP" launch --np 4 --spares 1 --mpirun-args=--oversubscribe --backoff 0 --log restarts.jsonl -- \
  "${train[@]}" "${slow[@]}" --checkpoint.dir=ck --checkpoint.every=5 > spare.log 2>&1 ||
  fail "launch with a spare exited $?: $(grep -E '^(launch|finding|stopped)' spare.log)"
grep -q '^launch: ranks 0-3 on processes 0,1,2,3; spare processes 4$' spare.log ||
  fail "no start-up line of the processes: $(grep '^launch' spare.log)"
[ "$(grep -c '^finding: .*detector straggler.*, ranks 2: ' spare.log)" = 1 ] ||
  fail "expected one straggler finding naming rank 2: $(grep '^finding' spare.log)"
grep -q '^stopped after step [0-9]* on the slow rank found' spare.log || fail "no stop line: $(tail -5 spare.log)"
grep -q '^launch: rank 2 moves from process 2 to spare process 4; ranks 0-3 on processes 0,1,4,3; spare processes none left; taken out 2$' spare.log ||
  fail "rank 2 not moved to the spare: $(grep '^launch' spare.log)"
grep -q '^launch: the job ended with exit 9 (a rank persistently slower than its peers)' spare.log ||
  fail "exit 9 not reported: $(grep '^launch' spare.log)"
grep -q '^launch: the job finished after 1 restart$' spare.log || fail "not finished after one restart: $(grep '^launch' spare.log)"
[ "$(model_hash spare.log | tail -1)" = "$want" ] || fail "the restarted job's hash $(model_hash spare.log | tail -1) != $want"
/usr/bin/python3 - restarts.jsonl <<'PY' || fail "restart record: $(cat restarts.jsonl)"
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
assert len(rs) == 1 and rs[0]["exit_status"] == 9, rs
assert rs[0]["replaced"] == [{"rank": 2, "process": 2, "by": 4}], rs
# The stop saved a checkpoint after its step: nothing lost.
assert rs[0]["steps_lost"] == 0 and rs[0]["resumed_step"] == rs[0]["last_step"], rs
PY

# A persistent fault (a bit of a parameter flipped on process 1 at every step from 8 on, found by
# the replica check, every rollback meeting it again): exit 8 naming rank 1, which moves to the
# spare; the job resumes from its checkpoint of step 8 and ends on the clean model (dp4 is
# canonical: the same hash as dp2 x tp2).
rm -rf ck
"$LOCKSTEP" launch --np 4 --spares 1 --mpirun-args=--oversubscribe --backoff 0 -- \
  "$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=40 --parallel.dp=4 --verify.on_fault=rollback \
  --inject.site=param/lnf/weight --inject.kind=bitflip:bit=28,index=3 --inject.rank=1 --inject.step=8 \
  --inject.persistent=true --checkpoint.dir=ck --checkpoint.every=4 > fault.log 2>&1 ||
  fail "launch with a spare after a persistent fault exited $?: $(grep -E '^(launch|persistent)' fault.log)"
grep -q '^persistent fault: .*; ranks 1 (exclude' fault.log || fail "no persistent fault on rank 1: $(tail -5 fault.log)"
grep -q '^launch: rank 1 moves from process 1 to spare process 4; ranks 0-3 on processes 0,4,2,3' fault.log ||
  fail "rank 1 not moved to the spare: $(grep '^launch' fault.log)"
grep -q '^launch: attempt 2 resumed from step 8 (0 steps lost' fault.log || fail "not resumed from step 8: $(grep '^launch' fault.log)"
[ "$(model_hash fault.log | tail -1)" = "$want" ] || fail "after the persistent fault: $(model_hash fault.log | tail -1) != $want"

# Without a spare: not restarted, the job's status kept.
set +e
"$LOCKSTEP" launch --np 4 --mpirun-args=--oversubscribe --backoff 0 -- "${train[@]}" "${slow[@]}" > nospare.log 2>&1
rc=$?
set -e
[ "$rc" = 9 ] || fail "without a spare launch exited $rc, not 9: $(tail -3 nospare.log)"
grep -q '^launch: the job ended with exit 9 .*; not restarted: a slow rank stays slow on its device; --spares N' nospare.log ||
  fail "no 'not restarted' line: $(grep '^launch' nospare.log)"

mpi() { mpirun --oversubscribe -np 2 "$@"; }
LOCKSTEP_ACTIVE_RANKS=0,7 expect_mpi_error \
  'LOCKSTEP_ACTIVE_RANKS=0,7: expected distinct launcher ranks below 2 separated by commas; .7. is not one' \
  -x LOCKSTEP_ACTIVE_RANKS "$LOCKSTEP" train --config cfg.toml --train.steps=1
expect_error 'lockstep launch: --spares needs --np' "$LOCKSTEP" launch --spares 1 -- true
echo PASS
