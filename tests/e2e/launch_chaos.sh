#!/usr/bin/env bash
# lockstep launch under chaos: a random rank of a 4-rank job is SIGKILLed at a random step (every
# other trial with asynchronous checkpoints, so that kills also land in the middle of a save); the
# supervisor restarts the job, which resumes from its newest valid checkpoint, and every trial ends
# on the uninterrupted single-process model hash — on dp2 x tp2 zero 1 and dp4 zero 2. Each restart
# is a line and a JSONL record (cause, steps lost, seconds to resume). Exits a restart cannot mend
# are not restarted: an input error (2) ends the supervision at once with its status; nor is a job
# preempted by SIGTERM, which checkpoints first.
#   launch_chaos.sh LOCKSTEP WORK SRC [TRIALS per layout: default 2, 20 in the full campaign]
source "$(dirname "$0")/lib.sh"
trials=${4:-$(full_campaign && echo 20 || echo 2)}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
# d_model 128 and a vocabulary of 384 keep tp2's split reductions on 64-element chunks.
write_tp_config 384 128
steps=16
train=("$LOCKSTEP" train --config cfg.toml --train.steps=$steps --train.threads=1 --log.every=1)
"${train[@]}" > full.log
want=$(model_hash full.log)
[ -n "$want" ] || fail "no model hash: $(tail -3 full.log)"

for layout in "dp2tp2|--parallel.dp=2 --parallel.tp=2 --parallel.zero=1" "dp4z2|--parallel.dp=4 --parallel.zero=2"; do
  IFS='|' read -r name flags <<< "$layout"
  for trial in $(seq "$trials"); do
    log="${name}_$trial.log"
    rm -rf ck restarts.jsonl
    async=$([ $((trial % 2)) = 1 ] && echo true || echo false)
    # shellcheck disable=SC2086
    "$LOCKSTEP" launch --np 4 --mpirun-args=--oversubscribe --max-restarts 3 --backoff 0 --log restarts.jsonl -- \
      "${train[@]}" $flags --parallel.timeout_s=60 --checkpoint.dir=ck --checkpoint.every=2 --checkpoint.async=$async \
      > "$log" 2>&1 &
    launcher=$!
    # The kill: after a random step's line, a random rank of the running job.
    at=$((RANDOM % (steps - 6) + 1))  # six steps or more left: the job is still running
    for _ in $(seq 400); do
      grep -q "^step *$at/" "$log" && break
      sleep 0.02
    done
    sleep "0.0$((RANDOM % 5))"
    job=$(pgrep -P "$launcher" | head -1)
    victim=$(pgrep -P "$job" 2>/dev/null | shuf -n 1)
    [ -n "$victim" ] && kill -9 "$victim" || fail "$name trial $trial: no rank to kill after step $at: $(tail -3 "$log")"
    wait "$launcher" || fail "$name trial $trial: launch exited $?: $(grep '^launch' "$log")"
    grep -q '^launch: the job ended with exit 137 (a process killed by signal 9' "$log" ||
      fail "$name trial $trial: the kill after step $at was not seen: $(grep '^launch' "$log")"
    grep -q '^launch: the job finished after [1-9]' "$log" || fail "$name trial $trial: no restart: $(grep '^launch' "$log")"
    got=$(grep '^model hash ' "$log" | tail -1 | awk '{print $3}')
    [ "$got" = "$want" ] || fail "$name trial $trial (async $async, killed after step $at): hash $got != $want"
    /usr/bin/python3 - restarts.jsonl <<'PY' || fail "$name trial $trial: restart records: $(cat restarts.jsonl)"
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
assert rs and all(r["event"] == "restart" and r["exit_status"] == 137 for r in rs), rs
assert all(r["steps_lost"] == r["last_step"] - r["resumed_step"] >= 0 for r in rs), rs
# The job resumed from the newest checkpoint it had reported, or a newer one that landed unreported
# (an asynchronous save reports at the next step); without a checkpoint it started afresh.
assert all(r["resumed_step"] >= r["last_checkpoint_step"] for r in rs), rs
assert all((r["resumed_step"] == 0) == (r["seconds_to_resume"] is None) for r in rs), rs
assert all(r["seconds_to_resume"] is None or r["seconds_to_resume"] > 0 for r in rs), rs
PY
  done
done

# Preemption: SIGTERM to the supervisor reaches the job, which saves a checkpoint after its step and
# stops; the supervisor does not restart it, and the same command later ends on the full run's model.
"$LOCKSTEP" launch -- "${train[@]}" --checkpoint.dir=ck_term > term.log 2>&1 &
launcher=$!
for _ in $(seq 400); do
  grep -q "^step *3/" term.log && break
  sleep 0.02
done
kill -TERM "$launcher"
status=0
wait "$launcher" || status=$?
[ "$status" != 0 ] || fail "a preempted job's supervisor exited 0"
grep -q '^stopped by signal 15 after step [0-9]* (checkpoint saved' term.log || fail "no emergency checkpoint: $(tail -3 term.log)"
grep -q '^launch: stopped by signal 15 (Terminated), passed on to the job, which ended with exit [0-9]*; not restarted' term.log ||
  fail "$(grep '^launch' term.log)"
"$LOCKSTEP" launch -- "${train[@]}" --checkpoint.dir=ck_term > term2.log 2>&1 || fail "resume after preemption: $(tail -3 term2.log)"
grep -q '^resumed from ck_term/step_' term2.log || fail "no resume after preemption"
[ "$(model_hash term2.log)" = "$want" ] || fail "preempted and resumed: hash differs"

# An input error is not restarted.
status=0
"$LOCKSTEP" launch --max-restarts 3 -- "$LOCKSTEP" train --config cfg.toml --train.steps=0 > bad.log 2>&1 || status=$?
[ "$status" = 2 ] || fail "an input error: launch exited $status, expected 2: $(tail -3 bad.log)"
grep -q '^launch: the job ended with exit 2 (an input error); not restarted' bad.log || fail "$(grep '^launch' bad.log)"
expect_error 'lockstep launch: no job command' "$LOCKSTEP" launch --max-restarts 2 --
expect_error 'lockstep launch: --backoff expects seconds' "$LOCKSTEP" launch --backoff=x -- true
echo "PASS: $trials trials per layout, every one on the uninterrupted model hash"
