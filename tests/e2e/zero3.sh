#!/usr/bin/env bash
# ZeRO-3: parameters sharded over dp and gathered a layer at a time before the layer runs.
#  - canonical mode, reduce = exact: dp2 and dp4 (several micro-batches a rank), dp2 x tp2 with
#    sequence parallelism off and on, full recomputation, bf16 with fp32 master weights and bf16
#    parameters with stochastic rounding: each ends on the single process's model hash;
#  - a checkpoint of a zero 3 run resumes under zero 3, zero 2, dp4 zero 3 and one process, each to
#    the same hash; a moment flipped at rest is found and rolled back to the clean hash;
#  - fast mode: zero 3 ends on zero 2's bits (a gather moves the parameters' bits), and every
#    dumped tensor of 2 steps is within the single process's op-local bounds;
#  - bf16 linears' weights are gathered in bf16: fewer bytes a step than fp32;
#  - memory: with eight layers a rank holds its shard and two layer windows, less than the whole
#    parameters, and less at dp4 than at dp2;
#  - bad input: zero 3 with what reads whole parameters by address or between passes, one line each.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
common=(--config cfg.toml --train.steps=4 --train.threads=1 --train.micro_batch_size=1 --model.seq_len=128
        --model.vocab_size=512 --model.d_model=128 --parallel.bucket_mb=0.015625)
run() { "$LOCKSTEP" train "${common[@]}" "$@"; }
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$LOCKSTEP" train "${common[@]}" \
  --parallel.timeout_s=60 "$@"; }

run > single.log
want=$(model_hash single.log)
[ -n "$want" ] || fail "no model hash in single.log"
mpi 2 --parallel.zero=3 > dp2.log 2>&1 || fail "dp2 zero 3: $(tail -5 dp2.log)"
same_hash "dp2 zero 3" dp2.log
grep -Eq "^parallel: step 1 .*; [0-9]+ ZeRO-3 layer gathers, [0-9]+% of their time hidden" dp2.log \
  || fail "dp2 zero 3: no gather figures: $(grep '^parallel: step' dp2.log)"
mpi 4 --parallel.zero=3 > dp4.log 2>&1 || fail "dp4 zero 3: $(tail -5 dp4.log)"
same_hash "dp4 zero 3" dp4.log
for sp in false true; do
  mpi 4 --parallel.dp=2 --parallel.tp=2 --parallel.sp=$sp --parallel.zero=3 > tp2_sp$sp.log 2>&1 \
    || fail "dp2 x tp2 sp $sp zero 3: $(tail -5 tp2_sp$sp.log)"
  same_hash "dp2 x tp2 sp $sp zero 3" tp2_sp$sp.log
done
mpi 2 --parallel.zero=3 --train.recompute=full > recompute.log 2>&1 || fail "recompute: $(tail -5 recompute.log)"
same_hash "dp2 zero 3, full recomputation" recompute.log
for master in true false; do
  run --train.precision=bf16 --train.master_weights=$master > bf16_$master.log
  mpi 2 --parallel.zero=3 --train.precision=bf16 --train.master_weights=$master > bf16_z3_$master.log 2>&1 \
    || fail "bf16 zero 3 master weights $master: $(tail -5 bf16_z3_$master.log)"
  same_hash "bf16 dp2 zero 3, master weights $master" bf16_z3_$master.log "$(model_hash bf16_$master.log)"
done

# bf16 linears' weights are gathered in bf16: a step sends fewer bytes than in fp32.
sent() { sed -nE 's/^parallel: step 1 sent ([0-9]+) bytes.*/\1/p' "$1"; }
[ -n "$(sent dp2.log)" ] && [ "$(sent bf16_z3_true.log)" -lt "$(sent dp2.log)" ] ||
  fail "bf16 zero 3 sent $(sent bf16_z3_true.log) bytes in step 1, fp32 $(sent dp2.log)"

# Checkpoints: a zero 3 run's step-2 checkpoint, resumed under four layouts.
mpi 2 --parallel.zero=3 --checkpoint.dir=ck --checkpoint.every=2 --train.stop_after=1 > first.log 2>&1 \
  || fail "zero 3 run to step 2: $(tail -5 first.log)"
resume() {  # NAME NP ARGS...: resume the step-2 checkpoint in a directory of its own
  local name=$1 np=$2; shift 2
  mkdir -p "ck_$name" && cp -r ck/step_00000002 "ck_$name/"
  if [ "$np" = 1 ]; then run --checkpoint.dir="ck_$name" "$@" > "resume_$name.log" 2>&1
  else mpi "$np" --checkpoint.dir="ck_$name" "$@" > "resume_$name.log" 2>&1; fi || fail "resume $name: $(tail -5 "resume_$name.log")"
  grep -q "^resumed from ck_$name/step_00000002" "resume_$name.log" || fail "resume $name did not resume"
  same_hash "resumed under $name" "resume_$name.log"
}
resume z3 2 --parallel.zero=3
resume z2 2 --parallel.zero=2
resume dp4_z3 4 --parallel.zero=3
resume single 1

# A moment flipped at rest on rank 1: found by the state-at-rest check, the step rolled back.
mpi 2 --parallel.zero=3 --verify.on_fault=rollback --inject.site=optim/m --inject.kind=bitflip:bit=3,index=10 \
  --inject.rank=1 --inject.step=1 > rollback.log 2>&1 || fail "rollback: $(tail -5 rollback.log)"
grep -q "^rolled back to step 1" rollback.log || fail "no rollback: $(grep -E '^(finding|rolled)' rollback.log)"
same_hash "zero 3 after a rollback" rollback.log

# Fast mode.
fast=(--train.mode=fast --train.stop_after=1 --checkpoint.every=1 --checkpoint.keep=8)
run "${fast[@]}" --checkpoint.dir=fck_single --dump.dir=fsingle > fast_single.log
mpi 2 "${fast[@]}" --parallel.zero=2 --checkpoint.dir=fck_z2 > fast_z2.log 2>&1 || fail "fast zero 2: $(tail -5 fast_z2.log)"
mpi 2 "${fast[@]}" --parallel.zero=3 --checkpoint.dir=fck_z3 --dump.dir=fz3 > fast_z3.log 2>&1 \
  || fail "fast zero 3: $(tail -5 fast_z3.log)"
same_hash "fast dp2 zero 3 against zero 2" fast_z3.log "$(model_hash fast_z2.log)"
"$LOCKSTEP" diff fsingle fz3 --bounds --ckpt-a=fck_single --ckpt-b=fck_z3 > fast_diff.txt ||
  fail "fast dp2 zero 3 outside its op-local bounds: $(head -1 fast_diff.txt); $(awk '$3 != 0' fast_diff.txt | head -4)"

# Memory: eight layers, the parameter bytes a rank holds against the whole parameters' 4 N.
held() { sed -nE 's/.*ZeRO-3 holds ([0-9]+) bytes: a shard of ([0-9]+) .*, instead of ([0-9]+)\).*/\1 \2 \3/p' "$1"; }
for np in 2 4; do
  mpi $np --parallel.zero=3 --model.n_layers=8 --train.stop_after=0 > deep_dp$np.log 2>&1 || fail "8 layers dp$np: $(tail -5 deep_dp$np.log)"
done
read -r held2 shard2 whole < <(held deep_dp2.log)
read -r held4 shard4 _ < <(held deep_dp4.log)
[ -n "$held2" ] && [ -n "$held4" ] || fail "no ZeRO-3 memory in the parallel lines: $(grep '^parallel:' deep_dp2.log)"
[ "$held2" -lt "$whole" ] && [ "$held4" -lt "$held2" ] || fail "ZeRO-3 holds $held2 (dp2), $held4 (dp4) of $whole bytes"
# The shard is N / dp but for its cuts, each moved up to the next 64-element chunk start (and
# the rounding of r · N / dp).
python3 -c "import sys; s2, s4, n = $shard2, $shard4, $whole // 4; sys.exit(not (abs(s2 - n / 2) <= 64 + 1 and abs(s4 - n / 4) <= 64 + 1))" \
  || fail "shards $shard2 (dp2), $shard4 (dp4) of $((whole / 4)) parameters"

# Bad input: one line each.
refused() {  # NAME EXPECTED-TEXT ARGS...
  local name=$1 text=$2; shift 2
  local status=0
  mpi 2 --parallel.zero=3 "$@" > "$name.log" 2>&1 || status=$?
  [ "$status" -ne 0 ] || fail "$name: zero 3 accepted it"
  [ "$(grep -c '^error:' "$name.log")" -eq 1 ] || fail "$name: expected one error line: $(cat "$name.log")"
  grep -q "^error: .*\[parallel\] zero = 3 does not run with $text" "$name.log" || fail "$name: $(grep '^error' "$name.log")"
}
refused abft "\[verify\] abft" --verify.abft=true
refused pp "\[parallel\] pp > 1" --parallel.pp=2 --parallel.dp=1
refused inject "\[inject\] site param/lnf/weight" --inject.site=param/lnf/weight --inject.kind=bitflip:bit=0 --inject.step=1
status=0
run --parallel.zero=4 > zero4.log 2>&1 || status=$?
[ "$status" -ne 0 ] && grep -q "^error: .*\[parallel\] zero (4) must be 0 .* or 3" zero4.log || fail "zero 4: $(cat zero4.log)"

echo "zero3: dp2, dp4, dp2 x tp2 (sp off/on), recompute, bf16 (master weights, stochastic rounding) zero 3 = single" \
  "process ($want); resumed across zero 3/2, dp4 and one process; rollback; fast = zero 2 and within bounds;" \
  "8 layers hold $held2 (dp2) and $held4 (dp4) of $whole parameter bytes"
