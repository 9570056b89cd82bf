#!/usr/bin/env bash
# BF16 training ([train] precision = "bf16", src/model/precision.hpp):
#  - canonical mode: the same model hash on 1, 2 and 3 threads, AVX2 and the widest ISA the CPU has,
#    micro-batch splits, dp2 (zero 0, 1, 2), tp2 and dp2 x tp2 with sequence parallelism (zero 1),
#    and after a checkpoint resumed by another layout — and a different one from the fp32 run's;
#  - with master_weights = false (bf16 parameters, stochastic rounding) the same hash on threads,
#    ISAs, dp2 zero 2 and dp2 x tp2 sp, verify step bitwise, a mismatched resume refused;
#  - ABFT checks the bf16 products without a false alarm or a changed bit (in fast mode too, whose
#    products read the master weights rounded as they pack them), and names a flipped one;
#  - fast mode runs to the end and learns; fp32_linears = "head" changes the hash;
#  - the recipe is printed at start-up; a checkpoint written in bf16 refuses an fp32 resume;
#  - `verify step` passes a canonical bf16 checkpoint bitwise (the emulation with the recipe's
#    roundings) and a fast one within its bounds; `diff --bounds` of an fp32 and a bf16 run finds
#    each side within its own recipe's op-local bounds and their difference explained;
#  - sampled reference checks pass clean bf16 runs and name a wrong bf16 value;
#  - an unknown precision and an fp32_linears entry that names no linear: one clear error each.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
# d_model 128 and a vocabulary of 384 keep tp2's split reductions on 64-element chunks.
write_tp_config 384 128
sed -i 's/^mode = .*/mode = "canonical"\nprecision = "bf16"/' cfg.toml
steps=6
run() { "$LOCKSTEP" train --config cfg.toml --train.steps=$steps "$@"; }
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$LOCKSTEP" train --config cfg.toml \
  --train.steps=$steps --train.threads=1 "$@"; }

run --train.threads=1 > one.log
want=$(model_hash one.log)
[ -n "$want" ] || fail "no model hash: $(tail -3 one.log)"
grep -q '^precision: bf16 (linear layers: bf16 inputs, weights and outputs, fp32 accumulation' one.log \
  || fail "no precision line: $(head -3 one.log)"
run --train.precision=fp32 > fp32.log
[ "$(model_hash fp32.log)" != "$want" ] || fail "the bf16 run has the fp32 run's hash"
grep -q '^precision: fp32$' fp32.log || fail "no fp32 precision line"

for t in 2 3; do run --train.threads=$t > t$t.log; same_hash "threads $t" t$t.log; done
run --train.isa=avx2 > avx2.log  # the first run took the widest the CPU has
same_hash "isa avx2" avx2.log
for mb in 2 8; do run --train.micro_batch_size=$mb > mb$mb.log; same_hash "micro-batch $mb" mb$mb.log; done
for zero in 0 1 2; do
  mpi 2 --parallel.dp=2 --parallel.zero=$zero > dp2_z$zero.log 2>&1 || fail "dp2 zero $zero: $(tail -3 dp2_z$zero.log)"
  same_hash "dp2 zero $zero" dp2_z$zero.log
done
mpi 2 --parallel.tp=2 > tp2.log 2>&1 || fail "tp2: $(tail -3 tp2.log)"
same_hash tp2 tp2.log
mpi 4 --parallel.dp=2 --parallel.tp=2 --parallel.sp=true --parallel.zero=1 > dp2tp2.log 2>&1 \
  || fail "dp2 x tp2 sp: $(tail -3 dp2tp2.log)"
same_hash "dp2 x tp2 sp zero 1" dp2tp2.log

# A checkpoint at step 4 of a dp2 run, resumed by tp2 with sequence parallelism.
mpi 2 --parallel.dp=2 --checkpoint.dir=ck --checkpoint.every=4 > ck_a.log 2>&1 || fail "dp2 with checkpoints: $(tail -3 ck_a.log)"
rm -rf ck/step_00000006
cp -r ck ck32
mpi 2 --parallel.tp=2 --parallel.sp=true --checkpoint.dir=ck > ck_b.log 2>&1 || fail "tp2 resume: $(tail -3 ck_b.log)"
grep -q '^resumed from .*step_00000004' ck_b.log || fail "tp2 did not resume from step 4: $(head -3 ck_b.log)"
same_hash "resumed by tp2 sp" ck_b.log
expect_error "cannot resume: it was written with \[train\] precision = \"bf16\", this run has \"fp32\"" \
  "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --train.precision=fp32 --checkpoint.dir=ck32

# ABFT checks the bf16 products (of the weights' bf16 copies, named as the weights) without a
# false alarm and changes no bit; a flipped bit in one is found and named.
run --verify.abft=true > abft.log
same_hash "abft on" abft.log
grep -q '^abft: [1-9][0-9]* products checked on rank 0, 0 failed' abft.log || fail "abft: $(grep '^abft' abft.log)"
status=0
run --verify.abft=true --inject.site=gemm/layer/0/mlp/fc/weight/forward --inject.kind=bitflip:bit=28 \
  --inject.step=2 > abft_fault.log 2>&1 || status=$?
[ "$status" -eq 6 ] || fail "abft fault: expected exit 6, got $status: $(tail -3 abft_fault.log)"
grep -q '^finding: after step 3, detector abft, site gemm/layer/0/mlp/fc/weight/forward, ranks 0' abft_fault.log \
  || fail "abft fault not named: $(grep '^finding' abft_fault.log)"

# Fast mode: where the VDPBF16PS products run, a bf16 linear reads its fp32 master weight rounded as
# they pack it (no bf16 copy); ABFT checks the products on rounded copies: the same bits, no alarm.
run --train.mode=fast --train.threads=1 > fast_t1.log
run --train.mode=fast --train.threads=1 --verify.abft=true > fast_abft.log
[ "$(model_hash fast_abft.log)" = "$(model_hash fast_t1.log)" ] \
  || fail "fast, abft on: hash $(model_hash fast_abft.log) != $(model_hash fast_t1.log)"
grep -q '^abft: [1-9][0-9]* products checked on rank 0, 0 failed' fast_abft.log || fail "fast abft: $(grep '^abft' fast_abft.log)"

# bf16 parameters without master weights: AdamW's result rounded stochastically, each element by
# its global index, so threads, ISAs and layouts keep the bits; verify step emulates the rounding.
run --train.threads=1 --train.master_weights=false --checkpoint.dir=ck_sr --checkpoint.every=4 > sr.log
want_sr=$(model_hash sr.log)
[ -n "$want_sr" ] && [ "$want_sr" != "$want" ] || fail "master_weights = false: hash '$want_sr' (bf16 with master weights: $want)"
grep -q 'bf16 parameters updated by stochastic rounding' sr.log || fail "no stochastic-rounding recipe line: $(head -3 sr.log)"
sr_same() {  # name log
  [ "$(model_hash "$2")" = "$want_sr" ] || fail "master_weights = false, $1: hash $(model_hash "$2") != $want_sr"
}
run --train.threads=2 --train.isa=avx2 --train.master_weights=false > sr_t2.log
sr_same "threads 2 avx2" sr_t2.log
mpi 2 --parallel.dp=2 --parallel.zero=2 --train.master_weights=false > sr_dp2.log 2>&1 || fail "sr dp2: $(tail -3 sr_dp2.log)"
sr_same "dp2 zero 2" sr_dp2.log
mpi 4 --parallel.dp=2 --parallel.tp=2 --parallel.sp=true --parallel.zero=1 --train.master_weights=false > sr_dp2tp2.log 2>&1 \
  || fail "sr dp2 x tp2: $(tail -3 sr_dp2tp2.log)"
sr_same "dp2 x tp2 sp zero 1" sr_dp2tp2.log
rm -rf ck_sr/step_00000006
"$LOCKSTEP" verify step --config cfg.toml --train.master_weights=false --checkpoint ck_sr > verify_sr.log \
  || fail "verify step, bf16 parameters: $(tail -3 verify_sr.log)"
grep -Eq '^param/layer/0/mlp/fc/weight +\[512,128\] +bitwise ' verify_sr.log \
  || fail "verify step, bf16 parameters: the update is not bitwise: $(grep 'param/layer/0/mlp/fc/weight' verify_sr.log)"
expect_error "cannot resume: it was written with \[train\] master_weights = false, this run has true" \
  "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --checkpoint.dir=ck_sr
expect_error "\[train\] master_weights = false needs precision = \"bf16\"" \
  "$LOCKSTEP" train --config cfg.toml --train.precision=fp32 --train.master_weights=false

run --train.fp32_linears=head > head32.log
[ "$(model_hash head32.log)" != "$want" ] || fail "fp32_linears = head did not change the model"
steps=40 run --train.mode=fast > fast.log
python3 - fast.log <<'PY' || fail "fast bf16 did not learn: $(grep '^step' fast.log)"
import re, sys
losses = [float(m.group(1)) for m in re.finditer(r"^step .*\| loss ([0-9.]+)", open(sys.argv[1]).read(), re.M)]
assert len(losses) >= 2 and losses[-1] < losses[0] - 1.0, losses
PY

# diff --bounds of an fp32 and a bf16 run's dumped step: each side within the op-local bounds of
# its own recipe, their difference within what both sides' roundings and their inputs explain.
for p in fp32 bf16; do
  steps=4 run --train.precision=$p --checkpoint.dir=ck_$p --checkpoint.every=3 --dump.dir=dump_$p --dump.steps=3 \
    > dump_$p.log || fail "dump $p: $(tail -3 dump_$p.log)"
done
"$LOCKSTEP" diff dump_fp32 dump_bf16 --bounds --ckpt-a=ck_fp32 --ckpt-b=ck_bf16 > diff_bounds.log \
  || fail "diff --bounds fp32 vs bf16: $(head -3 diff_bounds.log)"
grep -q '^diff dump_fp32 dump_bf16 (mode bounds): agree' diff_bounds.log || fail "diff --bounds: $(head -2 diff_bounds.log)"
grep -Eq '^step/3/layer/0/ln1/out .* 0\.99 ' diff_bounds.log || fail "diff --bounds: the bf16 side is not held to its rounding: $(grep ln1/out diff_bounds.log)"

expect_error "\[train\] precision: expected \"fp32\", \"bf16\" or \"fp8\", got \"fp16\"" \
  "$LOCKSTEP" train --config cfg.toml --train.precision=fp16
expect_error "\[train\] fp32_linears: \"layer/9\" names no linear layer of this model" \
  "$LOCKSTEP" train --config cfg.toml --train.fp32_linears=head,layer/9
# Sampled reference checks round where the model does: clean bf16 runs pass every op's bound in
# both modes; a wrong bf16 mantissa bit in the activation's output is named.
for mode in canonical fast; do reference_clean $mode --train.mode=$mode; done
reference_fault layer/0/mlp/act 20
# verify step of the bf16 checkpoint: bitwise against the CanonicalF32 emulation with the recipe's
# roundings; a fast-mode bf16 checkpoint within the Bounded<double> bounds.
"$LOCKSTEP" verify step --config cfg.toml --checkpoint ck32 > verify.log || fail "verify step: $(tail -3 verify.log)"
grep -q '^verify step: PASS' verify.log || fail "verify step did not pass: $(tail -2 verify.log)"
grep -Eq '^layer/0/ln1/out +\[8,64,128\] +bitwise ' verify.log || fail "verify step not bitwise: $(grep ln1/out verify.log)"
steps=4 run --train.mode=fast --checkpoint.dir=ckf > ckf.log
"$LOCKSTEP" verify step --config cfg.toml --train.mode=fast --checkpoint ckf --reference.type=double > verify_fast.log \
  || fail "verify step fast: $(tail -3 verify_fast.log)"
grep -q '^verify step: PASS' verify_fast.log || fail "fast verify step did not pass: $(tail -2 verify_fast.log)"
echo "train_bf16: canonical bf16 hash $want on threads, ISAs, micro-batches, dp2 zero 0-2, tp2, dp2 x tp2 sp, resume"
