#!/usr/bin/env bash
# [verify] on_fault = "rollback" end to end: a transient fault found in its step rolls every rank
# back to the step's in-memory snapshot and the step runs again, so the run ends on the model of a
# clean run, bitwise; a persistent fault (--inject.persistent=true) meets every replay and stops
# the run with exit 8, naming the rank.
#  - a faulty multiply (a GEMM product, [verify] abft) in canonical and in fast mode;
#  - memory corruption at rest (a parameter flipped after the update, found before the next step);
#  - dp2 ZeRO-1 with verified collectives: a corrupted exact sum and a corrupted parameter
#    all-gather (found after the update, before the next snapshot) on rank 1;
#  - a persistent corrupted message on rank 1: exit 8, the rank named, no checkpoint of a later step;
#  - [verify] replay_every: clean runs replayed every step (canonical and fast, one process and dp2)
#    find nothing; a transient fault in an activation (no checksum covers it) in a replayed step is
#    found as transient and the run ends on the clean model; in a step that is not replayed it is
#    not found (the rate is 1/N at replay_every = N); the reduced gradient changed before the update
#    (dp2) is found by the replay and corrected; one that makes one replica's gradient norm
#    infinite is found by every rank alike (the norm is agreed) and rolled back.
source "$(dirname "$0")/lib.sh"
make_data
write_config
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { "$LOCKSTEP" train --config cfg.toml --train.steps=8 --verify.on_fault=rollback "$@"; }
same_model() {  # LOG CLEAN_LOG WHAT
  grep -q '^rolled back to step ' "$1" || fail "$3: no rollback: $(grep -E '^(finding|error)' "$1")"
  grep -q '^done: 8 steps' "$1" || fail "$3: the run did not finish: $(tail -3 "$1")"
  [ "$(model_hash "$1")" = "$(model_hash "$2")" ] \
    || fail "$3: the model after the rollback ($(model_hash "$1")) is not the clean run's ($(model_hash "$2"))"
}

for mode in canonical fast; do
  run --train.mode=$mode > clean_$mode.log 2>&1 || fail "clean $mode: $(tail -3 clean_$mode.log)"
  run --train.mode=$mode --verify.abft=true --inject.site=gemm/layer/1/mlp/fc/weight/forward --inject.step=3 \
    --inject.kind=bitflip:bit=27,index=300 > gemm_$mode.log 2>&1 || fail "gemm $mode: $(tail -3 gemm_$mode.log)"
  grep -q '^rolled back to step 3 (its in-memory snapshot; replay 1 of at most 2) on the abft finding at gemm/layer/1/mlp/fc/weight/forward' \
    gemm_$mode.log || fail "gemm $mode: no rollback line: $(grep -E '^(finding|rolled)' gemm_$mode.log)"
  same_model gemm_$mode.log clean_$mode.log "gemm $mode"
done

run --inject.site=param/wte --inject.kind=bitflip:bit=26,index=6210 --inject.step=4 > rest.log 2>&1 \
  || fail "at rest: $(tail -3 rest.log)"
grep -q '^finding: after step 5, detector state_at_rest' rest.log || fail "at rest: no finding"
same_model rest.log clean_canonical.log "at rest"

mpi() {
  timeout 240 mpirun --oversubscribe -np 2 "$LOCKSTEP" train --config cfg.toml --train.steps=8 --train.threads=1 \
    --parallel.dp=2 --parallel.zero=1 --parallel.timeout_s=60 --verify.collectives=true --verify.on_fault=rollback "$@"
}
mpi > clean_dp.log 2>&1 || fail "clean dp2: $(tail -3 clean_dp.log)"
mpi --inject.site=comm/dp/all_to_allv --inject.step=2 --inject.rank=1 --inject.kind=bitflip:bit=29,index=123,nth=1 \
  > sums.log 2>&1 || fail "dp2 sums: $(tail -3 sums.log)"
same_model sums.log clean_dp.log "dp2 sums"
mpi --inject.site=comm/dp/all_gatherv --inject.step=2 --inject.rank=1 --inject.kind=bitflip:bit=29,index=123,nth=2 \
  > params.log 2>&1 || fail "dp2 params: $(tail -3 params.log)"
same_model params.log clean_dp.log "dp2 parameter all-gather"

status=0
mpi --checkpoint.dir=ck --checkpoint.every=1 --inject.persistent=true --inject.site=comm/dp/all_to_allv --inject.step=3 \
  --inject.rank=1 --inject.kind=bitflip:bit=29,index=123,nth=1 > persistent.log 2>&1 || status=$?
[ "$status" -eq 8 ] || fail "persistent: expected exit 8, got $status: $(tail -3 persistent.log)"
[ "$(grep -c '^rolled back to step 3 ' persistent.log)" -eq 2 ] || fail "persistent: expected two replays"
grep -q '^persistent fault: step 3 met the collectives finding at all_to_allv on dp again in each of 2 replays from its snapshot; ranks 1 ' \
  persistent.log || fail "persistent: no message naming rank 1: $(tail -2 persistent.log)"
[ -d ck/step_00000003 ] && [ ! -d ck/step_00000004 ] || fail "persistent: checkpoints $(ls ck)"
for mode in canonical fast; do
  run --train.mode=$mode --verify.replay_every=1 > replay_clean_$mode.log 2>&1 || fail "replayed $mode: $(tail -3 replay_clean_$mode.log)"
  grep -q '^finding' replay_clean_$mode.log && fail "replayed $mode: $(grep '^finding' replay_clean_$mode.log)"
  grep -q '^replays: 8 (every 1 steps' replay_clean_$mode.log || fail "replayed $mode: no summary"
  [ "$(model_hash replay_clean_$mode.log)" = "$(model_hash clean_$mode.log)" ] || fail "replayed $mode: another model"
done
act="--inject.site=layer/1/mlp/act --inject.kind=bitflip:bit=27,index=300"
run --verify.replay_every=2 $act --inject.step=3 > replay_hit.log 2>&1 || fail "replay: $(tail -3 replay_hit.log)"
grep -q '^finding: after step 4, detector replay, site parameters and moments after the step, ranks 0: ranks 1 against bound 0 (transient)' \
  replay_hit.log || fail "replay: no transient finding: $(grep '^finding' replay_hit.log)"
[ "$(model_hash replay_hit.log)" = "$(model_hash clean_canonical.log)" ] || fail "replay: not the clean model"
run --verify.replay_every=2 $act --inject.step=2 > replay_miss.log 2>&1 || fail "replay miss: $(tail -3 replay_miss.log)"
grep -q '^finding' replay_miss.log && fail "a step that is not replayed was judged: $(grep '^finding' replay_miss.log)"
[ "$(model_hash replay_miss.log)" != "$(model_hash clean_canonical.log)" ] || fail "the unreplayed fault changed nothing"
mpi --verify.replay_every=1 > replay_dp.log 2>&1 || fail "replayed dp2: $(tail -3 replay_dp.log)"
grep -q '^finding' replay_dp.log && fail "replayed dp2: $(grep '^finding' replay_dp.log)"
# The reduced gradient changed on rank 1 between the reduction and the update (optim/grad): no
# checksum covers it; the replay finds it as transient and the run ends on the clean model.
mpi --verify.replay_every=1 --inject.site=optim/grad --inject.step=2 --inject.rank=1 \
  --inject.kind=bitflip:bit=27,index=100 > grad.log 2>&1 || fail "reduced gradient: $(tail -3 grad.log)"
grep -q '^finding: after step 3, detector replay, .*(transient)' grad.log \
  || fail "reduced gradient: no transient replay finding: $(grep '^finding' grad.log)"
[ "$(model_hash grad.log)" = "$(model_hash clean_dp.log)" ] || fail "reduced gradient: not the clean model"
# An exponent flip there makes one replica's gradient norm infinite while the other's is finite:
# every rank must reach the same finding and roll back together (not part ways and wait).
mpi --inject.site=optim/grad --inject.step=2 --inject.rank=1 --inject.kind=bitflip:bit=30,index=100 \
  > grad_inf.log 2>&1 || fail "one replica's infinite norm: $(tail -3 grad_inf.log)"
grep -q '^finding: after step 3, detector nonfinite, site grad_norm, ranks 1:' grad_inf.log \
  || fail "one replica's infinite norm: no finding: $(grep -E '^(finding|rank)' grad_inf.log)"
same_model grad_inf.log clean_dp.log "one replica's infinite norm"
echo "rollback and replay: transient faults leave the clean model, persistent ones stop naming the rank"
