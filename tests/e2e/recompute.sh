#!/usr/bin/env bash
# Activation recomputation ([train] recompute): selective (attention sub-layers) and full (attention
# and MLP) end on the model hash of a run without, in one process, under tp2 with sp and under pp2
# 1F1B (whose stage holds micro-batches in flight); a dump of a recomputed run is bitwise the dump
# without (observers see each tensor once, not again when the forward runs a second time); a bad
# value is one error line.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_tp_config 384 128
train=("$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=12)
"${train[@]}" --train.micro_batch_size=2 --dump.dir=plain --dump.steps=0-1 > none.log
want=$(model_hash none.log)
for r in selective full; do
  "${train[@]}" --train.micro_batch_size=2 --train.recompute=$r --dump.dir="dump_$r" --dump.steps=0-1 > "$r.log"
  [ "$(model_hash "$r.log")" = "$want" ] || fail "recompute $r: $(model_hash "$r.log") != $want"
  "$LOCKSTEP" diff plain "dump_$r" > "diff_$r.txt" || fail "recompute $r: the dump differs: $(head -3 "diff_$r.txt")"
  grep -q 'agree (' "diff_$r.txt" || fail "recompute $r: $(head -2 "diff_$r.txt")"
done
mpirun --oversubscribe -np 2 "${train[@]}" --train.micro_batch_size=2 --train.recompute=full --parallel.tp=2 --parallel.sp=true > tp.log 2>&1 ||
  fail "tp2 sp full recompute: $(tail -3 tp.log)"
[ "$(model_hash tp.log)" = "$want" ] || fail "tp2 sp full recompute: $(model_hash tp.log) != $want"
mpirun --oversubscribe -np 2 "${train[@]}" --train.recompute=full --parallel.pp=2 --train.micro_batch_size=1 > pp.log 2>&1 ||
  fail "pp2 full recompute: $(tail -3 pp.log)"
[ "$(model_hash pp.log)" = "$want" ] || fail "pp2 full recompute: $(model_hash pp.log) != $want"
expect_error 'cfg.toml: \[train\] recompute: expected "none", "selective" or "full", got "some"' \
  "$LOCKSTEP" train --config cfg.toml --train.recompute=some
echo PASS
