#!/usr/bin/env bash
# [checkpoint] async = true: each rank copies its shards to host memory at the end of the step and
# a thread writes them while training goes on. The checkpoints are the synchronous saves' bit for bit
# (every tensor's checksum and the model hash, one process and dp2 x tp2 zero 1), the run's last
# checkpoint is whole when the run ends, every save is reported with the stall it cost the step,
# and a run resumed from an asynchronous checkpoint ends on the uninterrupted run's model hash.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
# d_model 128 and a vocabulary of 384 keep tp2's split reductions on 64-element chunks.
write_tp_config 384 128
steps=6
launch() {  # NP FLAGS...
  local np=$1; shift
  if [ "$np" = 1 ]; then
    "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --train.threads=1 --checkpoint.every=2 --checkpoint.keep=0 "$@"
  else
    mpirun --oversubscribe -np "$np" "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --train.threads=1 \
      --checkpoint.every=2 --checkpoint.keep=0 "$@"
  fi
}
for layout in "1|" "4|--parallel.dp=2 --parallel.tp=2 --parallel.zero=1"; do
  IFS='|' read -r np flags <<< "$layout"
  # shellcheck disable=SC2086
  launch "$np" $flags --checkpoint.dir="sync$np" > "sync$np.log" 2>&1 || fail "sync, $np ranks: $(tail -3 "sync$np.log")"
  # shellcheck disable=SC2086
  launch "$np" $flags --checkpoint.dir="async$np" --checkpoint.async=true > "async$np.log" 2>&1 ||
    fail "async, $np ranks: $(tail -3 "async$np.log")"
  [ "$(model_hash "async$np.log")" = "$(model_hash "sync$np.log")" ] || fail "$np ranks: async saves changed the run"
  [ "$(grep -c '^checkpoint async.*written in [0-9.]* s beside training, the step stalled [0-9.]* s)$' "async$np.log")" = 3 ] ||
    fail "$np ranks: expected 3 asynchronous save lines: $(grep '^checkpoint' "async$np.log")"
  for step in 2 4 6; do
    d=$(printf 'step_%08d' $step)
    "$LOCKSTEP" ckpt info "sync$np/$d" | tail -n +2 > a.info
    "$LOCKSTEP" ckpt info "async$np/$d" | tail -n +2 > b.info
    diff -q a.info b.info > /dev/null || fail "$np ranks, step $step: async checkpoint differs: $(diff a.info b.info | head -5)"
  done
done
rm -rf async4/step_00000006
mpirun --oversubscribe -np 4 "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --train.threads=1 \
  --parallel.dp=2 --parallel.tp=2 --parallel.zero=1 --checkpoint.dir=async4 --checkpoint.async=true > resume.log 2>&1 ||
  fail "resume: $(tail -3 resume.log)"
grep -q '^resumed from async4/step_00000004' resume.log || fail "did not resume from step 4"
[ "$(model_hash resume.log)" = "$(model_hash sync4.log)" ] || fail "resumed from an async checkpoint: hash differs"
echo PASS
