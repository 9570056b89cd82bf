#!/usr/bin/env bash
# Tensor and sequence parallelism under mpirun (2 and 4 ranks on whatever cores there are:
# --oversubscribe).
#  - canonical mode, reduce = exact: tp2, tp4 and dp2 x tp2 with zero 0, 1 and 2, each with
#    sequence parallelism off and on, end with a model hash bitwise equal to the single-process
#    run's, data-parallel replicas equal after every step; a second model (SwiGLU, grouped KV heads,
#    RMSNorm, untied head, no biases) and RoPE likewise under tp2;
#  - a dp2 x tp2 checkpoint (whole tensors gathered from the shards, the tp split recorded) resumed
#    by dp2 x tp2 with another zero, and by one process, ends on that hash; `ckpt info` reports it;
#  - fast mode under dp2 x tp2 runs to the end with equal replicas (no bitwise claim);
#  - --verify.replicas also compares the tensors every tp rank holds whole: a bit flipped
#    on one tp rank ends the job naming it;
#  - layouts that cannot be split are refused with a message saying which and why.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
# d_model 256 and a vocabulary of 512 keep every split reduction on 64-element chunks up to tp4.
write_tp_config 512 256
steps=4
run() { "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --train.threads=1 "$@"; }
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$LOCKSTEP" train --config cfg.toml \
  --train.steps=$steps --train.threads=1 "$@"; }

run > single.log
want=$(model_hash single.log)
[ -n "$want" ] || fail "no model hash in single.log"

for sp in false true; do
  mpi 2 --parallel.tp=2 --parallel.sp=$sp > tp2_sp$sp.log 2>&1 || fail "tp2 sp $sp failed: $(tail -5 tp2_sp$sp.log)"
  same_hash "tp2 sp $sp" tp2_sp$sp.log
  mpi 4 --parallel.tp=4 --parallel.sp=$sp > tp4_sp$sp.log 2>&1 || fail "tp4 sp $sp failed: $(tail -5 tp4_sp$sp.log)"
  same_hash "tp4 sp $sp" tp4_sp$sp.log
  for zero in 0 1 2; do
    log=dp2tp2_z${zero}_sp$sp.log
    mpi 4 --parallel.dp=2 --parallel.tp=2 --parallel.zero=$zero --parallel.sp=$sp --verify.replicas=true \
      > $log 2>&1 || fail "dp2 x tp2 zero $zero sp $sp failed: $(tail -5 $log)"
    same_hash "dp2 x tp2 zero $zero sp $sp" $log
  done
done
grep -q "^parallel: dp 1 x tp 2 x cp 1 x ep 1 x pp 1 (world 2), zero 0" tp2_spfalse.log || fail "tp2: no layout line"
grep -q "^parallel: dp 1 x tp 2 .*, sequence parallel," tp2_sptrue.log || fail "tp2 sp: no layout line"
grep -Eq "minimum sent per rank per step [0-9]+ bytes \(gradient sync [0-9]+, tensor parallel [1-9][0-9]*\)" \
  dp2tp2_z1_spfalse.log || fail "no communication minimum line: $(grep '^parallel' dp2tp2_z1_spfalse.log)"

# Every split the other model kinds add: SwiGLU's two halves, grouped KV heads, untied head rows;
# RMSNorm's weight alone under sequence parallelism; rotary positions.
other=(--model.ffn=swiglu --model.ffn_hidden=512 --model.n_kv_heads=2 --model.norm=rmsnorm
       --model.tie_embeddings=false --model.bias=false)
run "${other[@]}" > other.log
want=$(model_hash other.log)
for sp in false true; do
  mpi 2 --parallel.tp=2 --parallel.sp=$sp "${other[@]}" > other_tp2_sp$sp.log 2>&1 \
    || fail "other model tp2 sp $sp failed: $(tail -5 other_tp2_sp$sp.log)"
  same_hash "other model tp2 sp $sp" other_tp2_sp$sp.log
done
run --model.pos=rope > rope.log
want=$(model_hash rope.log)
mpi 2 --parallel.tp=2 --parallel.sp=true --model.pos=rope > rope_tp2.log 2>&1 || fail "rope tp2 sp failed: $(tail -5 rope_tp2.log)"
same_hash "rope tp2 sp" rope_tp2.log
want=$(model_hash single.log)

# Checkpoint at step 2 by dp2 x tp2 zero 1, resumed to step 4 by dp2 x tp2 zero 2 with sequence
# parallelism and by one process.
mpi 4 --parallel.dp=2 --parallel.tp=2 --parallel.zero=1 --checkpoint.dir=ck --checkpoint.every=2 > ck_a.log 2>&1 \
  || fail "dp2 x tp2 with checkpoints failed: $(tail -5 ck_a.log)"
grep -q '"tp_shards"' ck/step_00000002/manifest.json || fail "the checkpoint does not record the tp split"
rm -rf ck/step_00000004
cp -r ck ck_single
mpi 4 --parallel.dp=2 --parallel.tp=2 --parallel.zero=2 --parallel.sp=true --checkpoint.dir=ck > ck_b.log 2>&1 \
  || fail "dp2 x tp2 resume failed: $(tail -5 ck_b.log)"
grep -q '^resumed from .*step_00000002' ck_b.log || fail "dp2 x tp2 did not resume from step 2: $(head -3 ck_b.log)"
same_hash "resumed dp2 x tp2" ck_b.log
run --checkpoint.dir=ck_single > ck_c.log 2>&1 || fail "single-process resume failed: $(tail -5 ck_c.log)"
same_hash "single process resumed from a tp checkpoint" ck_c.log
"$LOCKSTEP" ckpt info ck > info.log
same_hash "ckpt info" info.log

# Fast mode: float all-reduces; replicas stay bitwise equal.
for sp in false true; do
  mpi 4 --parallel.dp=2 --parallel.tp=2 --parallel.sp=$sp --train.mode=fast --verify.replicas=true \
    > fast_sp$sp.log 2>&1 || fail "fast mode dp2 x tp2 sp $sp failed: $(tail -5 fast_sp$sp.log)"
  grep -q "^done: $steps steps" fast_sp$sp.log || fail "fast mode sp $sp did not finish"
done

# A tensor every tp rank holds whole that differs on one rank ends the job naming it.
status=0
mpi 2 --parallel.tp=2 --verify.replicas=true --inject.site=param/lnf/weight --inject.kind=bitflip:bit=0 \
  --inject.rank=1 --inject.step=1 > flipped.log 2>&1 || status=$?
[ "$status" -eq 6 ] || fail "flipped bit under tp2: expected exit 6 (replicas differ), got $status: $(tail -3 flipped.log)"
[ "$(grep -c '^finding:' flipped.log)" -eq 1 ] || fail "expected one finding line: $(grep '^finding' flipped.log)"
grep -q "^finding: after step 2, detector replicas, site tensors every tp rank holds whole (dp rank 0), ranks 1: .*world rank 1 has replicated-tensor hash" flipped.log \
  || fail "the tp replica check did not name tp rank 1: $(tail -3 flipped.log)"

# Refused layouts (every rank prints the same one-line error).
expect_mpi_error "vocab_size \(257\) must be a multiple of \[parallel\] tp \(2\)" 2 --parallel.tp=2 --model.vocab_size=257
expect_mpi_error "n_heads \(6\) must be a multiple of \[parallel\] tp \(4\)" 4 --parallel.tp=4 --model.n_heads=6 \
  --model.d_model=384
expect_mpi_error "canonical mode with tp = 4 needs d_model / tp \(16\) to be a multiple of the canonical chunk 64" \
  4 --parallel.tp=4 --model.d_model=64
expect_mpi_error "ffn_hidden / tp \(96\) to be a multiple of the canonical chunk 64" 2 --parallel.tp=2 \
  --model.ffn_hidden=192
expect_mpi_error "sp = true needs tp > 1" 2 --parallel.sp=true
expect_mpi_error "micro-batch tokens / tp \(64 / 2 = 32\) to be a multiple of the canonical chunk 64" 2 --parallel.tp=2 \
  --parallel.sp=true --train.micro_batch_size=1
echo "tp_canonical: tp2, tp4, dp2 x tp2 (zero 0/1/2), sp off/on: model hash $want = single process; resume; refusals ok"
