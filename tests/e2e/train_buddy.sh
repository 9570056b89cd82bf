#!/usr/bin/env bash
# [verify] buddy_every end to end: every N-th step each dp group also computes its neighbour's
# batch and the two computations are compared tensor by tensor.
#  - clean runs (dp3 canonical; dp2 fast mode with the fast reduction, whose order depends on the
#    rank) buddy-replayed every step find nothing and end on the model of the same run without it;
#  - a persistent fault in an activation on one rank — invisible to a replay on that rank, which
#    meets it again — stops the run with exit 8, the finding naming that rank (dp3), or under dp2 x
#    tp2 (fast mode) the pair of ranks one of which is faulty (two replicas cannot say which);
#  - a persistent fault another detector finds and every rollback meets again is pinned by a buddy
#    check before the run stops;
#  - a transient fault in a buddy-replayed step is found, named with its rank and corrected: the
#    run ends on the clean model;
#  - buddy replay without data parallelism is refused in one line.
source "$(dirname "$0")/lib.sh"
make_data
write_config
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() {  # NP ARGS...
  local np=$1
  shift
  timeout 300 mpirun --oversubscribe -np "$np" "$LOCKSTEP" train --config cfg.toml --train.steps=6 --train.threads=1 \
    --train.batch_size=12 --train.micro_batch_size=2 --parallel.timeout_s=60 "$@"
}
act="--inject.site=layer/1/mlp/act --inject.kind=bitflip:bit=27,index=300"

mpi 3 > clean_dp3.log 2>&1 || fail "clean dp3: $(tail -3 clean_dp3.log)"
mpi 3 --verify.buddy_every=1 > buddy_dp3.log 2>&1 || fail "buddy dp3: $(tail -3 buddy_dp3.log)"
grep -q '^finding' buddy_dp3.log && fail "buddy dp3: $(grep '^finding' buddy_dp3.log)"
grep -q '^buddy replays: 6 runs (every 1 steps' buddy_dp3.log || fail "buddy dp3: no summary: $(tail -3 buddy_dp3.log)"
[ "$(model_hash buddy_dp3.log)" = "$(model_hash clean_dp3.log)" ] || fail "buddy dp3: not the model of the run without it"

fast="--train.mode=fast --parallel.reduce=fast"
mpi 2 $fast > clean_fast.log 2>&1 || fail "clean dp2 fast: $(tail -3 clean_fast.log)"
mpi 2 $fast --verify.buddy_every=2 > buddy_fast.log 2>&1 || fail "buddy dp2 fast: $(tail -3 buddy_fast.log)"
grep -q '^finding' buddy_fast.log && fail "buddy dp2 fast: $(grep '^finding' buddy_fast.log)"
[ "$(model_hash buddy_fast.log)" = "$(model_hash clean_fast.log)" ] || fail "buddy dp2 fast: not the model without it"

# A persistent fault on rank 1 from step 2: a replay on rank 1 meets it again and sees nothing.
status=0
mpi 3 --verify.on_fault=rollback --verify.replay_every=1 $act --inject.step=2 --inject.rank=1 --inject.persistent=true \
  > replay_persistent.log 2>&1 || status=$?
[ "$status" -eq 0 ] || fail "replay, persistent: exit $status: $(tail -3 replay_persistent.log)"
grep -q '^finding' replay_persistent.log && fail "a replay on the faulty rank saw its persistent fault"
status=0
mpi 3 --verify.on_fault=rollback --verify.buddy_every=2 $act --inject.step=2 --inject.rank=1 --inject.persistent=true \
  > persistent.log 2>&1 || status=$?
[ "$status" -eq 8 ] || fail "persistent: expected exit 8, got $status: $(tail -3 persistent.log)"
grep -q '^finding: after step 4, detector buddy, site layer/1/mlp/act (tensor [0-9]* of the [0-9]* the step.s micro-batches showed, forward and backward), ranks 1: ranks 1 against bound 0 (persistent)' \
  persistent.log || fail "persistent: no finding naming rank 1: $(grep -E '^(finding|error)' persistent.log)"
grep -q '^persistent fault: step 3 computed its batches differently than their buddies in every run (buddy replay); ranks 1 (exclude the device' \
  persistent.log || fail "persistent: no stop naming rank 1: $(tail -2 persistent.log)"

status=0
mpi 4 --parallel.dp=2 --parallel.tp=2 --model.vocab_size=384 $fast --verify.buddy_every=1 $act --inject.step=1 --inject.rank=2 \
  --inject.persistent=true > pair.log 2>&1 || status=$?
[ "$status" -eq 8 ] || fail "dp2 x tp2 persistent: expected exit 8, got $status: $(tail -3 pair.log)"
grep -q '^finding: after step 2, detector buddy, site layer/1/mlp/act .*, ranks 0,2: ranks 2 against bound 0 (persistent, one of the ranks)' \
  pair.log || fail "dp2 x tp2 persistent: no finding naming ranks 0 and 2: $(grep -E '^(finding|error)' pair.log)"

# A persistent fault that another detector finds first (a norm's gradient on rank 3, which the tp
# replica check sees on ranks 1 and 3 once the dp reduction has spread it): when its rollbacks are
# spent, buddy replay pins it before the run stops.
status=0
mpi 4 --parallel.dp=2 --parallel.tp=2 --model.vocab_size=384 $fast --verify.on_fault=rollback --verify.buddy_every=4 \
  --inject.site=grad/layer/0/ln2/out --inject.kind=bitflip:bit=29,index=1000 --inject.step=2 --inject.rank=3 \
  --inject.persistent=true > pinned.log 2>&1 || status=$?
[ "$status" -eq 8 ] || fail "pinned after rollbacks: expected exit 8, got $status: $(tail -3 pinned.log)"
grep -q '^finding: after step 3, detector replicas, site tensors every tp rank holds whole (dp ranks 0,1), ranks 1,3:' \
  pinned.log || fail "pinned after rollbacks: no replica finding naming both groups: $(grep '^finding' pinned.log)"
[ "$(grep -c '^rolled back to step 2 ' pinned.log)" -eq 2 ] || fail "pinned after rollbacks: expected two rollbacks"
grep -q '^finding: after step 3, detector buddy, site grad/layer/0/ln2/out .*, ranks 1,3: .*(persistent, one of the ranks)' \
  pinned.log || fail "pinned after rollbacks: no buddy finding: $(grep '^finding' pinned.log)"
grep -q '^persistent fault: step 2 computed its batches differently than their buddies in every run' pinned.log \
  || fail "pinned after rollbacks: not stopped by the buddy check: $(tail -2 pinned.log)"

mpi 3 --verify.on_fault=rollback --verify.buddy_every=2 $act --inject.step=3 --inject.rank=2 > transient.log 2>&1 \
  || fail "transient: $(tail -3 transient.log)"
grep -q '^finding: after step 4, detector buddy, site layer/1/mlp/act .*, ranks 2: ranks 1 against bound 0 (transient)' \
  transient.log || fail "transient: no finding naming rank 2: $(grep -E '^(finding|error)' transient.log)"
[ "$(model_hash transient.log)" = "$(model_hash clean_dp3.log)" ] || fail "transient: not the clean model"

expect_error 'buddy_every \(2\) needs data parallelism' "$LOCKSTEP" train --config cfg.toml --train.steps=1 \
  --verify.buddy_every=2
echo "buddy replay: clean runs unchanged, persistent faults pinned to their rank (their pair under dp2), transient ones corrected"
