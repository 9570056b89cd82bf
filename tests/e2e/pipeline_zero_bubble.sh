#!/usr/bin/env bash
# The zero-bubble schedule (ZB-H1) in training: each backward is split into its input-gradient pass
# Bi, which the previous stage waits for, and its weight-gradient pass W, which fills the idle time.
# Canonical mode: pp2, pp4, pp2 x dp2 zero 2, pp2 x tp2 with sp, an untied head and bf16 each end
# on the single-process model hash, loss and validation loss (the full campaign,
# e2e/slow/parallel_layouts.sh, adds pp2 x dp2 zero 1 and pp2 x tp2 without sp); a zero-bubble
# checkpoint resumes under 1F1B; a dump is bitwise the single process's; fast mode's pp2 dump (the
# full campaign: and pp2 x dp2's) is within the single process's bounds; the measured bubble is
# printed beside 1F1B's. The settings the schedule does not run with are one error line each.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_pipeline_config
train=("$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=20 --train.micro_batch_size=1)
two=("$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=2 --train.micro_batch_size=1)
run() { "${two[@]}" "$@"; }
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "${two[@]}" "$@"; }
zb=(--parallel.schedule=zb)
"${train[@]}" > one.log
want=$(model_hash one.log)
loss=$(step20 one.log)
val=$(eval20 one.log)
[ -n "$want" ] && [ -n "$loss" ] && [ -n "$val" ] || fail "single process: $(tail -3 one.log)"
# Evaluation reads micro-batch-sized batches: the one process's figure with two sequences a micro-batch.
"${train[@]/--train.micro_batch_size=1/--train.micro_batch_size=2}" > one2.log
val2=$(eval20 one2.log)

# np|micro-batch size|flags (sequence parallelism needs 2 sequences a micro-batch for its chunks).
layouts=("2|1|--parallel.pp=2" "4|1|--parallel.pp=4" "4|1|--parallel.pp=2 --parallel.dp=2 --parallel.zero=2"
         "4|2|--parallel.pp=2 --parallel.tp=2 --parallel.sp=true")
full_campaign && layouts+=("4|1|--parallel.pp=2 --parallel.dp=2 --parallel.zero=1" "4|1|--parallel.pp=2 --parallel.tp=2")
for layout in "${layouts[@]}"; do
  IFS='|' read -r np mb flags <<< "$layout"
  # shellcheck disable=SC2086
  mpirun --oversubscribe -np "$np" "${train[@]/--train.micro_batch_size=1/--train.micro_batch_size=$mb}" "${zb[@]}" $flags \
    > zb.log 2>&1 || fail "$flags: $(tail -3 zb.log)"
  same_run "zero-bubble $flags" zb.log "$([ "$mb" = 1 ] && echo "$val" || echo "$val2")"
  grep -Eq '^pipeline: pp [24], schedule zb, [0-9]+ micro-batches a step; stages 0: embedding' zb.log ||
    fail "$flags: no pipeline line: $(grep '^pipeline' zb.log)"
done

# An untied head (its weight gradient in the last stage's weight passes), and bf16.
for extra in --model.tie_embeddings=false --train.precision=bf16; do
  "${train[@]}" "$extra" > one_x.log
  mpirun --oversubscribe -np 2 "${train[@]}" "$extra" "${zb[@]}" --parallel.pp=2 > zb_x.log 2>&1 ||
    fail "zero-bubble $extra: $(tail -3 zb_x.log)"
  same_hash "zero-bubble $extra" zb_x.log "$(model_hash one_x.log)"
done

# A zero-bubble checkpoint resumed by 1F1B.
mpirun --oversubscribe -np 2 "${train[@]}" "${zb[@]}" --parallel.pp=2 --checkpoint.dir=ck --checkpoint.every=10 \
  --train.stop_after=9 > first.log 2>&1 || fail "zero-bubble first half: $(tail -3 first.log)"
mpirun --oversubscribe -np 2 "${train[@]}" --parallel.pp=2 --checkpoint.dir=ck > resumed.log 2>&1 ||
  fail "resume under 1f1b: $(tail -3 resumed.log)"
same_hash "zero-bubble checkpoint resumed by 1f1b" resumed.log

# Dumps: canonical bitwise the single process's; fast within its bounds.
run --dump.dir=d_one > /dev/null
mpi 2 "${zb[@]}" --parallel.pp=2 --dump.dir=d_zb > d_zb.log 2>&1 || fail "zero-bubble dump: $(tail -3 d_zb.log)"
"$LOCKSTEP" diff d_one d_zb > d_zb.txt || fail "zero-bubble dump differs: $(head -3 d_zb.txt)"
fast_layouts=("2 zb2 ${zb[*]} --parallel.pp=2")
full_campaign && fast_layouts+=("4 zb2dp2 ${zb[*]} --parallel.pp=2 --parallel.dp=2 --parallel.zero=2")
fast_within_bounds -- "${fast_layouts[@]}"

# The measured bubble, 1F1B and zero-bubble (printed; time is not asserted).
for flags in "--parallel.pp=2" "${zb[*]} --parallel.pp=2"; do
  # shellcheck disable=SC2086
  mpirun --oversubscribe -np 2 "${train[@]}" $flags > bubble.log 2>&1 || fail "$flags: $(tail -3 bubble.log)"
  grep -q '^pipeline: measured bubble by pipeline rank' bubble.log || fail "$flags: no measured bubble: $(grep '^pipeline' bubble.log)"
  echo "$flags: $(grep '^pipeline: measured bubble' bubble.log)"
done

mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "${train[@]}" "$@"; }
expect_mpi_error 'schedule "zb" with recompute "selective": a weight-gradient pass reads the layers. inputs' 2 \
  "${zb[@]}" --parallel.pp=2 --train.recompute=selective
expect_mpi_error 'schedule "zb" with fp8 linears is not run yet' 2 "${zb[@]}" --parallel.pp=2 --train.precision=fp8
echo "pipeline_zero_bubble: pp2, pp4, pp2 x dp2, pp2 x tp2 sp, untied, bf16 = single process ($want); checkpoint; dumps"
