#!/usr/bin/env bash
# Expert parallelism: the routed experts of MoE layers (4 experts, top-2) split over ep ranks, every
# rank training on its own part of the batch.
#  - canonical mode: the one-process model hash for ep2, ep4, ep2 x dp2 (zero 2 with micro-batches
#    of one sequence), ep2 x tp2 with sequence parallelism, ep2 with full recomputation, ep2 x pp2
#    (1F1B) and ep2 x pp2 interleaved (4 layers, 2 stages a rank); a dropping capacity (SwiGLU,
#    sigmoid router), aux-loss-free selection biases, shared experts (ep2 x tp2), bf16 linears and
#    fp8 linears (delayed scaling under Hopper accumulation, ep2 x dp2; mxfp8, ep2) each on their
#    own one-process hash; the full campaign (e2e/slow/parallel_layouts.sh) adds ep2 x dp2 with
#    zero 1, zero 2 without overlap and zero 3, ep2 x dp2 x tp2 sp zero 2 and ep2 x pp2 x tp2 (8
#    ranks), ep2 x tp2 without sp, and the dropping capacity on ep4;
#  - evaluation splits its windows over the ep ranks and gives the one process's val loss (ep2, ep4);
#  - a rank holds only its experts (fewer parameters per rank) and counts what it exchanges;
#  - checkpoints: an ep2 run's checkpoint resumes under ep4 and on one process bitwise, and its
#    manifest's model hash is the tensors'; a one-process checkpoint converted offline to dp2 x ep2
#    resumes there bitwise;
#  - canonical dumps of an ep2 run are bitwise the one process's; verify step passes an ep2 run's
#    checkpoint;
#  - fast mode: ep2 x tp2 sp (the full campaign: also ep2 and ep2 x dp2) dumps every tensor of 2
#    steps as global tensors, and `lockstep diff --bounds` finds each within its op-local bound of
#    the one-process fast run;
#  - bad input: ep that does not divide the experts (train, ckpt convert), ep of a dense model, ep
#    with fp8 current scaling — one line each.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
common=(--config cfg.toml --model.seq_len=128 --model.vocab_size=512 --model.d_model=128 --model.moe_experts=4
        --model.moe_top_k=2 --model.moe_ffn_hidden=128 --parallel.timeout_s=60 --train.steps=4 --train.threads=1)
run() { "$LOCKSTEP" train "${common[@]}" "$@"; }
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$LOCKSTEP" train "${common[@]}" "$@"; }

want=$(one_process single)
[ -n "$want" ] || fail "no model hash in single.log"
on_hash ep2 "$want" 2 --parallel.ep=2
on_hash ep4 "$want" 4 --parallel.ep=4
on_hash ep2_dp2_z2 "$want" 4 --parallel.ep=2 --parallel.dp=2 --parallel.zero=2 --train.micro_batch_size=1
on_hash ep2_tp2_sp "$want" 4 --parallel.ep=2 --parallel.tp=2 --parallel.sp=true
on_hash ep2_recompute "$want" 2 --parallel.ep=2 --train.recompute=full
on_hash ep2_pp2 "$want" 4 --parallel.ep=2 --parallel.pp=2 --parallel.schedule=1f1b --train.micro_batch_size=1
if full_campaign; then
  on_hash ep2_dp2 "$want" 4 --parallel.ep=2 --parallel.dp=2 --parallel.zero=1 --train.micro_batch_size=1
  on_hash ep2_dp2_z2_serial "$want" 4 --parallel.ep=2 --parallel.dp=2 --parallel.zero=2 --parallel.overlap=false
  on_hash ep2_dp2_z3 "$want" 4 --parallel.ep=2 --parallel.dp=2 --parallel.zero=3
  on_hash ep2_dp2_tp2_sp_z2 "$want" 8 --parallel.ep=2 --parallel.dp=2 --parallel.tp=2 --parallel.sp=true --parallel.zero=2
  on_hash ep2_tp2 "$want" 4 --parallel.ep=2 --parallel.tp=2
  on_hash ep2_pp2_tp2 "$want" 8 --parallel.ep=2 --parallel.pp=2 --parallel.tp=2
fi
on_hash ep2_interleaved "$(one_process four_layers --model.n_layers=4)" 4 --model.n_layers=4 --parallel.ep=2 \
  --parallel.pp=2 --parallel.schedule=interleaved --parallel.virtual_stages=2 --train.micro_batch_size=1

# Evaluation: the ep ranks take the validation windows in turn (3 windows of 4 sequences over ep2,
# 6 of 2 over ep4: some run on every ep rank, counted once) and the val loss is the one process's.
val_losses() { python3 -c "import json, sys; print([r['val_loss'] for r in map(json.loads, open(sys.argv[1])) if 'val_loss' in r])" "$1"; }
eval=(--eval.every=2 --eval.batches=3)
run "${eval[@]}" --log.metrics=eval_one.jsonl > eval_one.log 2>&1 || fail "eval: $(tail -3 eval_one.log)"
want_val=$(val_losses eval_one.jsonl)
for layout in "2 ep2 --parallel.ep=2" "4 ep4 --parallel.ep=4"; do
  read -r np name flags <<< "$layout"
  # shellcheck disable=SC2086
  mpi "$np" "${eval[@]}" --log.metrics="eval_$name.jsonl" $flags > "eval_$name.log" 2>&1 || fail "eval $name: $(tail -3 "eval_$name.log")"
  [ "$(val_losses "eval_$name.jsonl")" = "$want_val" ] || fail "eval $name: $(val_losses "eval_$name.jsonl") != $want_val"
done

# What a rank holds and sends: its two experts of four per layer, and the exchanges counted.
grep -q "ep 2 x pp 1 (world 2)" ep2.log || fail "no ep in the layout line: $(grep '^parallel' ep2.log)"
total=$(sed -nE 's/^model: ([0-9]+) parameters.*/\1/p' ep2.log)
held=$(sed -nE 's/.* ([0-9]+) parameters per rank.*/\1/p' ep2.log)
[ -n "$held" ] && [ "$held" -lt "$total" ] || fail "ep2 rank holds $held of $total parameters"
grep -Eq "expert parallel [1-9][0-9]*\)" ep2.log || fail "no expert-parallel bytes: $(grep '^parallel' ep2.log)"
grep -Eq "^parallel: step 1 sent [1-9][0-9]* bytes" ep2.log || fail "nothing sent: $(grep '^parallel' ep2.log)"

drop=(--model.moe_capacity_factor=1 --model.ffn=swiglu --model.moe_router=sigmoid)
hash=$(one_process capacity "${drop[@]}")
[ "$hash" != "$want" ] || fail "the capacity run ended on the dropless hash"
on_hash capacity_ep2 "$hash" 2 --parallel.ep=2 "${drop[@]}"
full_campaign && on_hash capacity_ep4 "$hash" 4 --parallel.ep=4 "${drop[@]}"
bias=(--model.moe_bias_update=0.01 --model.moe_aux_weight=0)
on_hash bias_ep2 "$(one_process bias "${bias[@]}")" 2 --parallel.ep=2 "${bias[@]}"
on_hash shared_ep2_tp2 "$(one_process shared --model.moe_shared_experts=2)" 4 --parallel.ep=2 --parallel.tp=2 \
  --model.moe_shared_experts=2
on_hash bf16_ep2 "$(one_process bf16 --train.precision=bf16)" 2 --parallel.ep=2 --train.precision=bf16
fp8=(--train.precision=fp8 --fp8.accumulate=hopper)
on_hash fp8_ep2_dp2 "$(one_process fp8 "${fp8[@]}")" 4 --parallel.ep=2 --parallel.dp=2 "${fp8[@]}"
mx=(--train.precision=fp8 --fp8.recipe=mxfp8)
on_hash mxfp8_ep2 "$(one_process mxfp8 "${mx[@]}")" 2 --parallel.ep=2 "${mx[@]}"

# An ep2 checkpoint (step 2) resumes under ep4 and on one process, bitwise.
mpi 2 --parallel.ep=2 --checkpoint.dir=ck --checkpoint.every=2 --train.stop_after=1 > ck_first.log 2>&1 \
  || fail "ep2 checkpoint: $(tail -5 ck_first.log)"
"$LOCKSTEP" ckpt info ck/step_00000002 > info.log 2>&1 || fail "ckpt info: $(cat info.log)"
grep -q "^layout dp=1 ep=2 pp=1 tp=1" info.log || fail "ckpt info layout: $(cat info.log)"
cp -r ck ck_one
on_hash resumed_ep4 "$want" 4 --parallel.ep=4 --checkpoint.dir=ck --checkpoint.every=2
grep -q "^resumed from ck/step_00000002" resumed_ep4.log || fail "ep4 did not resume: $(head -5 resumed_ep4.log)"
run --checkpoint.dir=ck_one --checkpoint.every=2 > resumed_one.log 2>&1
grep -q "^resumed from ck_one/step_00000002" resumed_one.log || fail "one process did not resume"
same_hash "ep2 checkpoint resumed on one process" resumed_one.log
# A one-process checkpoint converted offline to dp2 x ep2 (zero 1): four data files, one a rank,
# and the run resumes from it bitwise.
run --checkpoint.dir=ck_single --checkpoint.every=2 --train.stop_after=1 > ck_single.log 2>&1
"$LOCKSTEP" ckpt convert ck_single --to-layout dp=2,ep=2,zero=1 ck_conv > conv.txt || fail "convert: $(cat conv.txt)"
grep -q "^converted step 2 to dp=2,ep=2,zero=1: ck_conv/step_00000002 (4 data files," conv.txt || fail "convert: $(cat conv.txt)"
on_hash resumed_converted "$want" 4 --parallel.ep=2 --parallel.dp=2 --parallel.zero=1 --checkpoint.dir=ck_conv
grep -q "^resumed from ck_conv/step_00000002" resumed_converted.log || fail "did not resume the converted checkpoint"
expect_error "--to-layout ep=3: \[parallel\] ep = 3 must divide \[model\] moe_experts \(4\)" \
  "$LOCKSTEP" ckpt convert ck_single --to-layout ep=3 ck_bad

# Canonical dumps: every tensor of an ep2 run's first two steps bitwise the one process's; verify
# step passes an ep2 run's checkpoint against the reference.
run --train.stop_after=1 --dump.dir=dump_single > dump_single.log 2>&1 || fail "dump: $(tail -3 dump_single.log)"
mpi 2 --parallel.ep=2 --train.stop_after=1 --dump.dir=dump_ep2 > dump_ep2.log 2>&1 || fail "ep2 dump: $(tail -3 dump_ep2.log)"
"$LOCKSTEP" diff dump_single dump_ep2 > dump_diff.txt || fail "ep2 dump differs: $(head -3 dump_diff.txt)"
grep -Eq "^diff dump_single dump_ep2 \(mode exact\): agree \([0-9]+ tensors\)" dump_diff.txt || fail "dump diff: $(head -2 dump_diff.txt)"
"$LOCKSTEP" verify step "${common[@]}" --checkpoint ck_one/step_00000002 > verify.log 2>&1 || fail "verify step: $(tail -3 verify.log)"
grep -q "^verify step: PASS" verify.log || fail "verify step: $(tail -3 verify.log)"

# Fast mode: within the one-process run's op-local bounds, tensor by tensor.
fast_layouts=("4 ep2_tp2_sp --parallel.ep=2 --parallel.tp=2 --parallel.sp=true")
full_campaign && fast_layouts+=("2 ep2 --parallel.ep=2" "4 ep2_dp2 --parallel.ep=2 --parallel.dp=2 --parallel.zero=1")
fast_within_bounds -- "${fast_layouts[@]}"

expect_mpi_error "\[parallel\] ep = 3 must divide \[model\] moe_experts \(4\)" 3 --parallel.ep=3 --train.batch_size=6 \
  --train.micro_batch_size=2
(
  common=(--config cfg.toml --parallel.timeout_s=60)  # write_config's dense model
  expect_mpi_error "\[parallel\] ep = 2 splits the routed experts of MoE layers, and this model has none" 2 \
    --parallel.ep=2
)
expect_mpi_error "\[parallel\] ep = 2 does not run with \[fp8\] recipe = \"current\"" 2 --parallel.ep=2 \
  --train.precision=fp8 --fp8.recipe=current
echo "expert_parallel: ok"
