#!/usr/bin/env bash
# Pipeline parallelism in canonical mode, tied embeddings: pp2, pp4, pp2 with GPipe, pp2 x dp2
# (zero 2) and pp2 x dp2 x tp2 with sp and zero 1 (the full campaign, e2e/slow/parallel_layouts.sh:
# also pp2 x tp2) each end on the single-process model hash, the loss and the validation loss
# printed alike; stages balanced by FLOPs or set by hand; an untied head too, and bf16; a pp2 x dp2
# checkpoint resumes under one process and under pp4 to the uninterrupted hash; dumps gather the stages' tensors (canonical bitwise, fast within bounds); a
# planted fault is found on its stage, and a corrupted pipeline message by its checksum.
# Layouts the pipeline cannot run are one error line each.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_tp_config 384 128
# Evaluation every 10 steps (through the stages). The embeddings are tied: the last stage's head
# computes with a copy of wte, its gradient summed exactly into the first stage's.
sed -i -e 's/^every = 0$/every = 10/' cfg.toml
train=("$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=20)
"${train[@]}" --train.micro_batch_size=1 > one.log
want=$(model_hash one.log)
loss=$(step20 one.log)
# Evaluation reads eval.batches x micro_batch_size sequences: its reference is one process's with
# the same micro-batch.
"${train[@]}" --train.micro_batch_size=2 > one2.log
val1=$(eval20 one.log)
val2=$(eval20 one2.log)
[ -n "$want" ] && [ -n "$loss" ] && [ -n "$val1" ] || fail "single process: $(tail -3 one.log)"
[ "$(model_hash one2.log)" = "$want" ] || fail "micro-batches of 2 changed the canonical model"

layouts=("2|--parallel.pp=2" "4|--parallel.pp=4" "2|--parallel.pp=2 --parallel.schedule=gpipe"
         "2|--parallel.pp=2 --parallel.stage_layers=2,5" "4|--parallel.pp=2 --parallel.dp=2 --parallel.zero=2"
         "8|--parallel.pp=2 --parallel.dp=2 --parallel.tp=2 --parallel.sp=true --parallel.zero=1")
full_campaign && layouts+=("4|--parallel.pp=2 --parallel.tp=2")
for layout in "${layouts[@]}"; do
  IFS='|' read -r np flags <<< "$layout"
  # shellcheck disable=SC2086
  case "$flags" in *sp=true*) micro=2 ;; *) micro=1 ;; esac  # sp: a rank's micro-batch / tp a whole chunk
  mpirun --oversubscribe -np "$np" "${train[@]}" --train.micro_batch_size=$micro $flags > pp.log 2>&1 ||
    fail "$flags: $(tail -3 pp.log)"
  same_run "$flags" pp.log "$([ "$micro" = 1 ] && echo "$val1" || echo "$val2")"
  grep -q '^pipeline: pp [24], schedule \(1f1b\|gpipe\), [0-9]* micro-batches a step; stages 0: embedding' pp.log ||
    fail "$flags: no pipeline line: $(grep '^pipeline' pp.log)"
done
mpirun --oversubscribe -np 2 "${train[@]}" --train.micro_batch_size=1 --parallel.pp=2 --parallel.stage_layers=2,5 \
  > hand.log 2>&1
grep -q 'stages 0: embedding..layer/0/attention (.*); 1: layer/0/mlp..head' hand.log ||
  fail "stage_layers=2,5 not as given: $(grep '^pipeline' hand.log)"

# BF16 (the recipe's roundings on every stage) with the detectors' checksums, rollback and a replay
# of every 5th step compared bitwise.
"${train[@]}" --train.micro_batch_size=1 --train.precision=bf16 > bf16_1.log
mpirun --oversubscribe -np 2 "${train[@]}" --train.micro_batch_size=1 --train.precision=bf16 --parallel.pp=2 \
  --verify.abft=true --verify.on_fault=rollback --verify.replay_every=5 > bf16_pp.log 2>&1 ||
  fail "bf16 pp2: $(tail -3 bf16_pp.log)"
grep -q '^replays: 4 (every 5 steps, compared bitwise)' bf16_pp.log || fail "bf16 pp2 replays: $(grep replays bf16_pp.log)"
[ "$(model_hash bf16_pp.log)" = "$(model_hash bf16_1.log)" ] || fail "bf16 pp2: $(model_hash bf16_pp.log)"

# An untied head: its own weight on the last stage.
"${train[@]}" --train.micro_batch_size=1 --model.tie_embeddings=false > untied1.log
mpirun --oversubscribe -np 2 "${train[@]}" --train.micro_batch_size=1 --model.tie_embeddings=false --parallel.pp=2 \
  > untied2.log 2>&1 || fail "untied pp2: $(tail -3 untied2.log)"
[ "$(model_hash untied2.log)" = "$(model_hash untied1.log)" ] || fail "untied pp2: $(model_hash untied2.log)"

# A pp2 x dp2 checkpoint resumed by one process and by pp4.
mpirun --oversubscribe -np 4 "${train[@]}" --train.micro_batch_size=1 --parallel.pp=2 --parallel.dp=2 \
  --checkpoint.dir=ck --checkpoint.every=10 --train.stop_after=9 > first.log 2>&1 || fail "pp2 x dp2 first half: $(tail -3 first.log)"
"$LOCKSTEP" ckpt verify ck | grep -q '^ok ' || fail "ckpt verify of the pp checkpoint"
grep -q '"pp": 2' ck/step_00000010/manifest.json || fail "the manifest does not record pp 2"
cp -r ck ck4
"${train[@]}" --checkpoint.dir=ck > resumed1.log
[ "$(model_hash resumed1.log)" = "$want" ] || fail "pp2 checkpoint resumed by one process: $(model_hash resumed1.log)"
mpirun --oversubscribe -np 4 "${train[@]}" --train.micro_batch_size=1 --parallel.pp=4 --checkpoint.dir=ck4 > resumed4.log 2>&1 ||
  fail "resume pp4: $(tail -3 resumed4.log)"
[ "$(model_hash resumed4.log)" = "$want" ] || fail "pp2 checkpoint resumed by pp4: $(model_hash resumed4.log)"

# Dumps gather every stage's tensors into one: pp2 x tp2 canonical is bitwise the single process's
# (196 tensors, the same order), pp2 fast within the op-local bounds of the single process's.
two=("$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=2 --train.micro_batch_size=2 --checkpoint.every=1)
"${two[@]}" --dump.dir=d_one > /dev/null
mpirun --oversubscribe -np 4 "${two[@]}" --parallel.pp=2 --parallel.tp=2 --dump.dir=d_pp > d_pp.log 2>&1 ||
  fail "pp2 x tp2 dump: $(tail -3 d_pp.log)"
"$LOCKSTEP" diff d_one d_pp > d_pp.txt || fail "pp2 x tp2 dump differs: $(head -3 d_pp.txt)"
cmp <(/usr/bin/python3 -c 'import json,sys; print([t["name"] for t in json.load(open(sys.argv[1]))["tensors"]])' d_one/manifest.json) \
    <(/usr/bin/python3 -c 'import json,sys; print([t["name"] for t in json.load(open(sys.argv[1]))["tensors"]])' d_pp/manifest.json) ||
  fail "the pp dump lists its tensors in another order than one process's"
"${two[@]}" --train.mode=fast --dump.dir=f_one --checkpoint.dir=fck_one > /dev/null
mpirun --oversubscribe -np 2 "${two[@]}" --train.mode=fast --parallel.pp=2 --dump.dir=f_pp --checkpoint.dir=fck_pp \
  > f_pp.log 2>&1 || fail "pp2 fast dump: $(tail -3 f_pp.log)"
"$LOCKSTEP" diff f_one f_pp --bounds --ckpt-a=fck_one --ckpt-b=fck_pp > f_pp.txt ||
  fail "pp2 fast outside its op-local bounds: $(head -1 f_pp.txt)"

# A fault planted in a parameter of the last stage is found there (the state-at-rest check names
# world rank 1); one planted on a stage the chosen rank does not hold is an error.
set +e
mpirun --oversubscribe -np 2 "${train[@]}" --train.micro_batch_size=1 --parallel.pp=2 --inject.site=param/lnf/weight \
  --inject.step=2 --inject.kind=bitflip:bit=30 > fault.log 2>&1
rc=$?
set -e
[ "$rc" = 6 ] || fail "a planted fault under pp2 ended with $rc, not 6: $(tail -3 fault.log)"
grep -q '^finding: after step 3, detector state_at_rest, site parameters, ranks 1: ' fault.log ||
  fail "the fault on the last stage is not named there: $(grep finding fault.log)"

# A pipeline message corrupted on the wire: its checksum ([verify] collectives) names the receiving
# rank and the sender, and a rollback leaves the clean run's model.
mpirun --oversubscribe -np 2 "${train[@]}" --train.micro_batch_size=1 --parallel.pp=2 --verify.collectives=true \
  --verify.on_fault=rollback --inject.site=comm/pp/send/recv --inject.step=2 --inject.rank=1 \
  --inject.kind=bitflip:bit=30,index=5,nth=1 > wire.log 2>&1 || fail "pp2 wire fault: $(tail -3 wire.log)"
grep -q '^finding: after step 3, detector collectives, site send/recv on pp, ranks 1: .*from world rank(s) 0' wire.log ||
  fail "the corrupted pipeline message is not named: $(grep finding wire.log)"
[ "$(model_hash wire.log)" = "$want" ] || fail "after the rollback: $(model_hash wire.log) != $want"

mpi() { mpirun --oversubscribe -np "$1" "${train[@]}" "${@:2}"; }
expect_mpi_error "\[inject\] site param/wpe on rank 1: no rank holds it" 2 --parallel.pp=2 --inject.site=param/wpe \
  --inject.step=2 --inject.kind=bitflip:bit=30 --inject.rank=1
expect_mpi_error "pp x virtual_stages = 8 stages need a layer each; the model has 7 layers" 8 --parallel.pp=8
expect_mpi_error "pp x virtual_stages = 8 stages need a layer each; the model has 7 layers" 2 --parallel.pp=2 \
  --parallel.schedule=interleaved --parallel.virtual_stages=4
expect_mpi_error "stage_layers \"3,5\" adds up to 8 layers; the model has 7" 2 --parallel.pp=2 --parallel.stage_layers=3,5
expect_mpi_error "stage_layers \"7,0\": '0' is not a number of layers >= 1" 2 --parallel.pp=2 --parallel.stage_layers=7,0
expect_mpi_error "virtual_stages \(2\) > 1 needs schedule = \"interleaved\"" 2 --parallel.pp=2 --parallel.virtual_stages=2
expect_mpi_error "\[verify\] buddy_every with \[parallel\] pp > 1: buddy replay names a faulty rank" 4 --parallel.pp=2 \
  --parallel.dp=2 --verify.buddy_every=2
echo PASS
