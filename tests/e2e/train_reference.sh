#!/usr/bin/env bash
# [verify] reference_every end to end: every N-th step one op of the forward, in turn, is computed
# again for a sample of rows in Bounded<double> on the trainer's own inputs and held to its derived
# bound.
#  - clean runs checking every op in turn (canonical and fast; tp2 with and without sequence
#    parallelism; pp2, each stage its own ops) find nothing and report how many ops they checked;
#  - a kernel that computes a wrong value in every run (a persistent bit flip in the activation's
#    output, which replays and buddies would meet again) is found when its op's turn comes: exit 6,
#    the finding naming the op;
#  - a negative interval is refused in one line.
source "$(dirname "$0")/lib.sh"
make_data
write_config
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { "$LOCKSTEP" train --config cfg.toml --train.steps=24 --verify.reference_every=1 "$@"; }
clean() {  # LOG
  grep -q '^finding' "$1" && fail "$1: $(grep '^finding' "$1")"
  grep -q '^reference checks: 24 ops re-checked on rank 0 (every 1 steps, in turn)' "$1" \
    || fail "$1: no summary: $(tail -3 "$1")"
}
for mode in canonical fast; do
  run --train.mode=$mode > clean_$mode.log 2>&1 || fail "clean $mode: $(tail -3 clean_$mode.log)"
  clean clean_$mode.log
done
for sp in false true; do
  timeout 300 mpirun --oversubscribe -np 2 "$LOCKSTEP" train --config cfg.toml --train.steps=24 --train.threads=1 \
    --verify.reference_every=1 --parallel.tp=2 --parallel.sp=$sp --model.vocab_size=384 --train.mode=fast \
    --parallel.timeout_s=60 > tp_sp$sp.log 2>&1 || fail "tp2 sp $sp: $(tail -3 tp_sp$sp.log)"
  clean tp_sp$sp.log
done

# A kernel wrong in every run (a persistent bit flip in the activation's output of LAYER on RANK's
# stage), found when its op's turn comes: exit 6, the finding naming the op and the rank.
wrong_kernel() {  # NAME LAYER RANK LAUNCHER...
  local name=$1 layer=$2 rank=$3 status=0
  shift 3
  "$@" --inject.site=layer/$layer/mlp/act --inject.step=0 --inject.persistent=true \
    --inject.kind=bitflip:bit=12,index=3 > "$name.log" 2>&1 || status=$?
  [ "$status" -eq 6 ] || fail "$name: expected exit 6, got $status: $(tail -3 "$name.log")"
  grep -q "^finding: after step [0-9]*, detector reference, site layer/$layer/mlp/act (.* rows of the first micro-batch), ranks $rank: error / bound [0-9.e+]* against bound 1 (kernel)" \
    "$name.log" || fail "$name: no finding naming the op: $(grep -E '^(finding|error)' "$name.log")"
}
wrong_kernel kernel 0 0 run

# Pipeline stages: each checks its own ops; a wrong kernel on the second stage is named there.
pp() { timeout 300 mpirun --oversubscribe -np 2 "$LOCKSTEP" train --config cfg.toml --train.steps=24 --train.threads=1 \
  --verify.reference_every=1 --parallel.pp=2 --train.micro_batch_size=1 --parallel.timeout_s=60 "$@"; }
pp > pp.log 2>&1 || fail "pp2: $(tail -3 pp.log)"
clean pp.log
wrong_kernel pp_kernel 1 1 pp

expect_error 'reference_every \(-1\) must be >= 0' "$LOCKSTEP" train --config cfg.toml --train.steps=1 \
  --verify.reference_every=-1
echo "reference checks: clean runs pass every op's derived bound; a kernel wrong in every run is named"
