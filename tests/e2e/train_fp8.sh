#!/usr/bin/env bash
# FP8 training ([train] precision = "fp8" with an [fp8] recipe, src/model/fp8_recipe.hpp):
#  - each recipe (delayed, current, mxfp8; blockwise where the dims allow its 128-wide blocks) has
#    one canonical model hash on threads, ISAs, dp2, tp2, dp2 x tp2 with sequence parallelism and
#    pp2, different from the others' and bf16's (threads, ISAs and dp2 x tp2: delayed here, every
#    recipe in the full campaign, e2e/slow/fp8_recipes.sh); fp8.gemms = "" is the bf16 run bit for bit;
#  - delayed scaling: the micro-batch split, evaluation, recomputation and step replays change no
#    bit; a checkpoint at step 4 resumed by tp2 ends on the straight run's hash (the amax histories
#    and scales travel in the checkpoint), and another recipe may not resume it;
#  - ABFT checks the fp8 products without a false alarm; a flipped bit in one is found, rolled back
#    and the run ends on the clean hash;
#  - the per-tensor statistics reach the metrics JSONL and the console;
#  - each recipe learns: 40 steps end within 0.02 nats of bf16's validation loss;
#  - verify step passes each recipe's checkpoint bitwise (the reference quantizes as the recipe says);
#  - sampled reference checks pass clean fp8 runs and name a wrong bit in an fp8 linear's product;
#  - errors, once each: an unknown recipe or GEMM, a blockwise layout that splits a block.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
# d_model 128 and a vocabulary of 384 keep tp2's split reductions on 64-element chunks.
write_tp_config 384 128
sed -i 's/^mode = .*/mode = "canonical"\nprecision = "fp8"/' cfg.toml
steps=6
run() { "$LOCKSTEP" train --config cfg.toml --train.steps=$steps "$@"; }
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$LOCKSTEP" train --config cfg.toml \
  --train.steps=$steps --train.threads=1 "$@"; }

run --train.threads=1 --train.precision=bf16 > bf16.log
bf16=$(model_hash bf16.log)
declare -A hashes
for recipe in delayed current mxfp8; do
  run --train.threads=1 --fp8.recipe=$recipe --log.metrics=$recipe.jsonl > $recipe.log
  want=$(model_hash $recipe.log)
  [ -n "$want" ] && [ "$want" != "$bf16" ] || fail "$recipe: hash '$want' (bf16: $bf16)"
  hashes[$recipe]=$want
  grep -q "^precision: fp8 $recipe scaling, hybrid (e4m3 activations and weights, e5m2 gradients)" $recipe.log \
    || fail "$recipe: no precision line: $(grep '^precision' $recipe.log)"
  # Threads, ISA and dp2 x tp2: every recipe in the full campaign, delayed scaling by default.
  [ $recipe = delayed ] || full_campaign || continue
  run --train.threads=2 --train.isa=avx2 --fp8.recipe=$recipe > ${recipe}_t2.log
  same_hash "$recipe threads 2 avx2" ${recipe}_t2.log "$want"
  mpi 4 --fp8.recipe=$recipe --parallel.dp=2 --parallel.tp=2 --parallel.sp=true --parallel.zero=1 \
    > ${recipe}_dp2tp2.log 2>&1 || fail "$recipe dp2 x tp2: $(tail -3 ${recipe}_dp2tp2.log)"
  same_hash "$recipe dp2 x tp2 sp" ${recipe}_dp2tp2.log "$want"
done
[ "${hashes[delayed]}" != "${hashes[current]}" ] && [ "${hashes[current]}" != "${hashes[mxfp8]}" ] \
  || fail "recipes share a hash: ${hashes[*]}"
want=${hashes[delayed]}
mpi 2 --parallel.dp=2 --parallel.zero=2 > dp2.log 2>&1 || fail "dp2: $(tail -3 dp2.log)"
same_hash "delayed dp2 zero 2" dp2.log "$want"
mpi 2 --parallel.tp=2 > tp2.log 2>&1 || fail "tp2: $(tail -3 tp2.log)"
same_hash "delayed tp2" tp2.log "$want"
mpi 2 --parallel.pp=2 --fp8.recipe=mxfp8 > pp2.log 2>&1 || fail "pp2: $(tail -3 pp2.log)"
same_hash "mxfp8 pp2" pp2.log "${hashes[mxfp8]}"
run --fp8.gemms= > nogemm.log
same_hash "no fp8 GEMM" nogemm.log "$bf16"

# Blockwise: 128-wide blocks need d_model 256 under tp2 (each rank's share of q, k, v and of the
# projection's inputs is then 128).
run --model.d_model=256 --fp8.recipe=blockwise > blockwise.log
blockwise=$(model_hash blockwise.log)
mpi 4 --model.d_model=256 --fp8.recipe=blockwise --parallel.dp=2 --parallel.tp=2 --parallel.sp=true > blockwise_dp2tp2.log 2>&1 \
  || fail "blockwise dp2 x tp2: $(tail -3 blockwise_dp2tp2.log)"
same_hash "blockwise dp2 x tp2 sp" blockwise_dp2tp2.log "$blockwise"
expect_mpi_error "fp8 recipe blockwise quantizes blocks of 128 along layer/0/attn/qkv's output features, but tensor parallelism over 2 ranks gives each rank 64" \
  2 --fp8.recipe=blockwise --parallel.tp=2

# Delayed scaling: the scale of a step comes from the steps before, so how the step is split and
# what else runs does not matter.
run --train.micro_batch_size=8 > mb8.log
same_hash "micro-batch 8" mb8.log "$want"
run --eval.every=1 > eval.log
same_hash "evaluation every step" eval.log "$want"
run --train.recompute=full > recompute.log
same_hash "full recomputation" recompute.log "$want"
run --verify.replay_every=2 > replay.log
same_hash "replays" replay.log "$want"
grep -q '^replays: 3 ' replay.log || fail "replays: $(grep '^replays' replay.log)"
mpi 2 --parallel.dp=2 --checkpoint.dir=ck --checkpoint.every=4 --train.stop_after=3 > ck_a.log 2>&1 \
  || fail "dp2 with checkpoints: $(tail -3 ck_a.log)"
mpi 2 --parallel.tp=2 --parallel.sp=true --checkpoint.dir=ck > ck_b.log 2>&1 || fail "tp2 resume: $(tail -3 ck_b.log)"
grep -q '^resumed from .*step_00000004' ck_b.log || fail "tp2 did not resume from step 4: $(head -3 ck_b.log)"
same_hash "resumed by tp2 sp" ck_b.log "$want"
expect_error "cannot resume: it was written with \[fp8\] recipe = \"delayed\", this run has \"current\"" \
  "$LOCKSTEP" train --config cfg.toml --train.steps=8 --fp8.recipe=current --checkpoint.dir=ck

# ABFT on the fp8 products (of the weights' quantized copies, named as the weights).
run --verify.abft=true > abft.log
same_hash "abft on" abft.log "$want"
grep -q '^abft: [1-9][0-9]* products checked on rank 0, 0 failed' abft.log || fail "abft: $(grep '^abft' abft.log)"
run --verify.abft=true --verify.on_fault=rollback --inject.site=gemm/layer/0/mlp/fc/weight/forward \
  --inject.kind=bitflip:bit=30 --inject.step=3 > abft_fault.log 2>&1 || fail "abft rollback: $(tail -3 abft_fault.log)"
grep -q '^finding: after step 4, detector abft, site gemm/layer/0/mlp/fc/weight/forward' abft_fault.log \
  || fail "abft fault not named: $(grep '^finding' abft_fault.log)"
same_hash "rolled back after an fp8 product fault" abft_fault.log "$want"

# The statistics: one JSONL record per step naming every fp8 tensor, and the console's worst ones.
python3 - delayed.jsonl <<'PY' || fail "fp8 metrics: $(grep fp8 delayed.jsonl | head -2)"
import json, sys
records = [json.loads(l) for l in open(sys.argv[1]) if '"fp8"' in l]
assert len(records) == 6, len(records)
t = records[-1]["fp8"]
assert "layer/1/mlp/proj/grad_output" in t and "head/input" not in t, sorted(t)
for name, s in t.items():
    assert 0 <= s["saturated"] <= 1 and 0 <= s["underflow"] <= 1 and s["amax"] > 0 and s["scale"] > 0, (name, s)
# Step 1 runs on scale 1: the tiny gradients underflow e5m2; the history fixes it from step 2.
first = records[0]["fp8"]
assert first["layer/0/attn/qkv/grad_output"]["scale"] == 1, first["layer/0/attn/qkv/grad_output"]
assert first["layer/0/attn/qkv/grad_output"]["underflow"] > 0.5, first["layer/0/attn/qkv/grad_output"]
assert max(s["underflow"] for n, s in t.items() if n.endswith("grad_output")) < 0.01, t
assert t["layer/0/attn/qkv/grad_output"]["scale"] > 1e6, t["layer/0/attn/qkv/grad_output"]
PY
grep -q '^fp8: most saturated .*, most underflow ' delayed.log || fail "no fp8 console line: $(tail -4 delayed.log)"

# Every recipe learns as bf16 does over 40 steps.
for recipe in bf16 delayed current mxfp8; do
  precision=fp8; [ $recipe = bf16 ] && precision=bf16
  steps=40 run --train.precision=$precision --fp8.recipe=${recipe/bf16/delayed} > learn_$recipe.log
done
python3 - <<'PY' || fail "fp8 recipes do not track bf16"
import re
val = {}
for r in ["bf16", "delayed", "current", "mxfp8"]:
    val[r] = float(re.search(r"val loss ([0-9.]+) \(", open(f"learn_{r}.log").read()).group(1))
for r in ["delayed", "current", "mxfp8"]:
    assert abs(val[r] - val["bf16"]) < 0.02, val
print("val loss after 40 steps:", val)
PY

expect_error "\[fp8\] recipe: expected \"delayed\", \"current\", \"mxfp8\" or \"blockwise\", got \"tensorwise\"" \
  "$LOCKSTEP" train --config cfg.toml --fp8.recipe=tensorwise
expect_error "\[fp8\] gemms: \"xgrad\" is not a GEMM" "$LOCKSTEP" train --config cfg.toml --fp8.gemms=fprop,xgrad
expect_error "\[fp8\] bf16_linears: \"layer/7\" names no linear layer" "$LOCKSTEP" train --config cfg.toml --fp8.bf16_linears=layer/7
# Sampled reference checks quantize where the model does: clean runs pass every op's bound; a
# wrong exponent bit in an fp8 linear's product is named (its bound is the quantization's, about
# 2^-4 of Σ|x||w|: a wrong low mantissa bit hides in it).
for recipe in delayed mxfp8; do reference_clean $recipe --fp8.recipe=$recipe; done
reference_fault layer/0/mlp/fc 27
# verify step: the reference quantizes as the recipe says (delayed scales from the checkpoint's
# state), bitwise in canonical mode.
for recipe in delayed current mxfp8; do
  run --fp8.recipe=$recipe --checkpoint.dir=ckv_$recipe > ckv_$recipe.log
  "$LOCKSTEP" verify step --config cfg.toml --fp8.recipe=$recipe --checkpoint ckv_$recipe > verify_$recipe.log \
    || fail "verify step $recipe: $(tail -3 verify_$recipe.log)"
  grep -q '^verify step: PASS' verify_$recipe.log || fail "verify step $recipe: $(tail -1 verify_$recipe.log)"
  grep -Eq '^grad/layer/0/mlp/fc/weight +\[512,128\] +bitwise ' verify_$recipe.log \
    || fail "verify step $recipe not bitwise: $(grep 'grad/layer/0/mlp/fc/weight' verify_$recipe.log)"
done
echo "train_fp8: canonical hashes delayed ${hashes[delayed]} current ${hashes[current]} mxfp8 ${hashes[mxfp8]} blockwise $blockwise (threads, ISAs, dp2 x tp2 sp: $(full_campaign && echo every recipe || echo delayed)); dp2, tp2, pp2"
