#!/usr/bin/env bash
# The interleaved 1F1B schedule in training: each pipeline rank holds several stages as model
# chunks (stage s = chunk x pp + rank), and a micro-batch goes round the ranks once per chunk.
# Canonical mode: pp2 with 2 and 3 virtual stages, pp4 with 2, pp2 x dp2 (zero 2), pp2 x tp2,
# an untied head and bf16 each end on the single-process model hash, loss and validation loss;
# an interleaved checkpoint resumes under one process and under 1F1B; a dump gathers the chunks'
# tensors bitwise into the single process's; the measured bubble is printed beside 1F1B's.
# Layouts the interleaved schedule cannot run are one error line each.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_pipeline_config
train=("$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=20 --train.micro_batch_size=1)
il=(--parallel.schedule=interleaved)
"${train[@]}" > one.log
want=$(model_hash one.log)
loss=$(step20 one.log)
val=$(eval20 one.log)
[ -n "$want" ] && [ -n "$loss" ] && [ -n "$val" ] || fail "single process: $(tail -3 one.log)"

for layout in "2|--parallel.pp=2 --parallel.virtual_stages=2" "2|--parallel.pp=2 --parallel.virtual_stages=3" \
              "4|--parallel.pp=4 --parallel.virtual_stages=2" \
              "4|--parallel.pp=2 --parallel.virtual_stages=2 --parallel.dp=2 --parallel.zero=2" \
              "4|--parallel.pp=2 --parallel.virtual_stages=2 --parallel.tp=2"; do
  IFS='|' read -r np flags <<< "$layout"
  # shellcheck disable=SC2086
  mpirun --oversubscribe -np "$np" "${train[@]}" "${il[@]}" $flags > il.log 2>&1 || fail "$flags: $(tail -3 il.log)"
  same_run "interleaved $flags" il.log "$val"
  grep -Eq '^pipeline: pp [24], schedule interleaved \([23] stages a rank\), [0-9]+ micro-batches a step; stages 0: embedding' il.log ||
    fail "$flags: no pipeline line: $(grep '^pipeline' il.log)"
done

# An untied head, and bf16.
for extra in --model.tie_embeddings=false --train.precision=bf16; do
  "${train[@]}" "$extra" > one_x.log
  mpirun --oversubscribe -np 2 "${train[@]}" "$extra" "${il[@]}" --parallel.pp=2 --parallel.virtual_stages=2 > il_x.log 2>&1 ||
    fail "interleaved $extra: $(tail -3 il_x.log)"
  same_hash "interleaved $extra" il_x.log "$(model_hash one_x.log)"
done

# An interleaved checkpoint resumed by one process and by 1F1B.
mpirun --oversubscribe -np 2 "${train[@]}" "${il[@]}" --parallel.pp=2 --parallel.virtual_stages=2 --checkpoint.dir=ck \
  --checkpoint.every=10 --train.stop_after=9 > first.log 2>&1 || fail "interleaved first half: $(tail -3 first.log)"
cp -r ck ck_1f1b
"${train[@]}" --checkpoint.dir=ck > resumed1.log
same_hash "interleaved checkpoint resumed by one process" resumed1.log
mpirun --oversubscribe -np 2 "${train[@]}" --parallel.pp=2 --checkpoint.dir=ck_1f1b > resumed2.log 2>&1 ||
  fail "resume under 1f1b: $(tail -3 resumed2.log)"
same_hash "interleaved checkpoint resumed by 1f1b" resumed2.log

# A dump gathers every chunk's tensors: bitwise the single process's.
two=("$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=2 --train.micro_batch_size=1)
"${two[@]}" --dump.dir=d_one > /dev/null
mpirun --oversubscribe -np 2 "${two[@]}" "${il[@]}" --parallel.pp=2 --parallel.virtual_stages=2 --dump.dir=d_il > d_il.log 2>&1 ||
  fail "interleaved dump: $(tail -3 d_il.log)"
"$LOCKSTEP" diff d_one d_il > d_il.txt || fail "interleaved dump differs: $(head -3 d_il.txt)"

# The measured bubble, 1F1B and interleaved (printed; time is not asserted).
for flags in "--parallel.pp=2" "${il[*]} --parallel.pp=2 --parallel.virtual_stages=2"; do
  # shellcheck disable=SC2086
  mpirun --oversubscribe -np 2 "${train[@]}" $flags > bubble.log 2>&1 || fail "$flags: $(tail -3 bubble.log)"
  grep -q '^pipeline: measured bubble by pipeline rank' bubble.log || fail "$flags: no measured bubble: $(grep '^pipeline' bubble.log)"
  echo "$flags: $(grep '^pipeline: measured bubble' bubble.log)"
done

mpi() { mpirun --oversubscribe -np "$1" "${train[@]}" "${@:2}"; }
expect_mpi_error "pp x virtual_stages = 12 stages need a layer each; the model has 11 layers" 2 "${il[@]}" \
  --parallel.pp=2 --parallel.virtual_stages=6
expect_mpi_error "interleaved.*multiple of pp" 4 "${il[@]}" --parallel.pp=4 --parallel.virtual_stages=2 \
  --train.batch_size=6
echo "pipeline_interleaved: pp2 v2/v3, pp4 v2, pp2 v2 x dp2, pp2 v2 x tp2, untied, bf16 = single process ($want); checkpoints; dump"
