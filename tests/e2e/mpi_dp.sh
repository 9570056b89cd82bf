#!/usr/bin/env bash
# Data parallelism under mpirun (2 and 4 ranks on whatever cores there are: --oversubscribe).
#  - canonical mode, reduce = exact: dp2 and dp4 with zero 0, 1 and 2 end with a model hash bitwise
#    equal to the single-process run's, and replicas hold bitwise equal parameters after every step
#    (--verify.replicas all-gathers a parameter hash per step and fails naming the rank);
#  - a dp2/zero2 checkpoint (ZeRO state gathered to rank 0) resumed by dp4/zero1 ends on that hash too,
#    and `ckpt info` of a dp checkpoint reports it;
#  - fast mode (and reduce = fast) runs to the end with equal replicas (only that: no bitwise claim);
#  - layouts that cannot work are refused with a message saying which and why.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
run() { "$LOCKSTEP" train --config cfg.toml --train.steps=8 --train.threads=1 "$@"; }
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$LOCKSTEP" train --config cfg.toml \
  --train.steps=8 --train.threads=1 --parallel.timeout_s=60 "$@"; }

run > single.log
want=$(model_hash single.log)
[ -n "$want" ] || fail "no model hash in single.log"

for np in 2 4; do
  for zero in 0 1 2; do
    mpi "$np" --parallel.zero=$zero --verify.replicas=true > dp${np}_z$zero.log 2>&1 \
      || fail "dp$np zero $zero failed: $(tail -5 dp${np}_z$zero.log)"
    got=$(model_hash dp${np}_z$zero.log)
    [ "$got" = "$want" ] || fail "dp$np zero $zero: model hash $got != single-process $want"
    grep -q "^parallel: dp $np x tp 1" dp${np}_z$zero.log || fail "dp$np zero $zero: no layout line"
  done
done
# ZeRO-1/2 hold 1/dp of the replicated optimizer state (up to shard rounding to 64-element chunks).
grep -Eq "optimizer state [0-9]+ bytes per rank \(replicated" dp2_z1.log || fail "no optimizer state bytes"

# Checkpoint written by dp2/zero2 at step 4, resumed by dp4/zero1 to step 8: the same model.
mpi 2 --parallel.zero=2 --checkpoint.dir=ck --checkpoint.every=4 > ck_a.log 2>&1 \
  || fail "dp2 zero2 with checkpoints failed: $(tail -5 ck_a.log)"
rm -rf ck/step_00000008
mpi 4 --parallel.zero=1 --checkpoint.dir=ck > ck_b.log 2>&1 || fail "dp4 resume failed: $(tail -5 ck_b.log)"
grep -q '^resumed from .*step_00000004' ck_b.log || fail "dp4 did not resume from step 4: $(head -3 ck_b.log)"
[ "$(model_hash ck_b.log)" = "$want" ] || fail "resumed dp4 hash $(model_hash ck_b.log) != $want"
"$LOCKSTEP" ckpt info ck > info.log
[ "$(model_hash info.log)" = "$want" ] || fail "ckpt info hash $(model_hash info.log) != $want"

# Fast mode and fast reduction: finish with bitwise equal replicas.
mpi 2 --train.mode=fast --parallel.zero=1 --verify.replicas=true > fast.log 2>&1 \
  || fail "fast mode dp2 failed: $(tail -5 fast.log)"
mpi 4 --parallel.reduce=fast --parallel.zero=2 --verify.replicas=true > fastred.log 2>&1 \
  || fail "reduce=fast dp4 failed: $(tail -5 fastred.log)"
grep -q '^done: 8 steps' fastred.log || fail "reduce=fast did not finish"

# Refused layouts (every rank prints the same one-line error).
expect_mpi_error "dp \(3\) x tp \(1\).* = 3 must equal the number of ranks \(2\)" 2 --parallel.dp=3
expect_mpi_error "batch_size \(8\) must be a multiple of \[parallel\] dp \(3\)" 3
expect_mpi_error "micro-batch of 1 sequences x seq_len 32 = 32 tokens is not a multiple of 64" 4 \
  --model.seq_len=32 --train.batch_size=4 --train.micro_batch_size=4
expect_mpi_error "\[inject\] rank \(2\) is not a rank of this run \(2 ranks\)" 2 \
  --inject.site=layer/0/mlp/res --inject.step=1 --inject.kind=bitflip:bit=27 --inject.rank=2

# An injection on one rank (silent corruption on one device) changes the reduced gradient, so the
# replicas stay equal but the model differs both from the clean run and from every rank injecting.
flip="--inject.site=layer/0/mlp/res --inject.step=1 --inject.kind=bitflip:bit=27"
mpi 2 --verify.replicas=true $flip --inject.rank=1 > inj_one.log || fail "dp2 inject rank 1: $(tail -3 inj_one.log)"
mpi 2 $flip > inj_all.log || fail "dp2 inject every rank: $(tail -3 inj_all.log)"
one=$(model_hash inj_one.log)
[ -n "$one" ] && [ "$one" != "$want" ] && [ "$one" != "$(model_hash inj_all.log)" ] ||
  fail "inject.rank=1: hash $one vs clean $want and every-rank $(model_hash inj_all.log)"
# An error of one rank's own, met during a step (its injection's index lies beyond its tensor),
# ends the job at once with that rank's line, while the other rank waits in the step's collectives.
status=0
start=$(date +%s)
mpi 2 $flip,index=99999999 --inject.rank=1 > rank_error.log 2>&1 || status=$?
[ "$status" -eq 2 ] || fail "one rank's error: expected exit 2, got $status: $(cat rank_error.log)"
[ $(( $(date +%s) - start )) -le 60 ] || fail "one rank's error: the job did not end promptly"
grep -q "^rank 1: error: \[inject\] bitflip index 99999999 is outside layer/0/mlp/res" rank_error.log \
  || fail "one rank's error: no line from rank 1: $(cat rank_error.log)"
echo "mpi_dp: dp2/dp4 x zero 0/1/2 model hash $want = single process; resume across layouts; fast mode ok"
