#!/usr/bin/env bash
# [verify] collectives end to end: checksums beside every dp and tp message, and a corrupted
# message never crashing or hanging a rank.
#  - dp2 ZeRO-1 with the exact reduction (canonical): a clean run with the checks has no finding and
#    the model of a run without them; a bit flipped in what rank 1 receives — the counts of the
#    exact reduction's records (its "header"), the exact sums themselves, the reduced gradient's and
#    the updated parameters' all-gathers — is a finding naming the operation, the group, the
#    receiving rank and the sender (exit 6; the parameters' after the update, before the next step),
#    and with on_fault = "warn" the run goes to its end;
#  - without the checks the same flips end in neither a crash nor a hang: the counts are read by
#    majority of three copies, so the run goes on (exit 0), and flipped sums give a different model
#    or a non-finite gradient (exit 0 or 7);
#  - the float reductions of fast mode are held to the reduction's bound: an exponent flip is found,
#    naming |sum - checksums| against it;
#  - dp2 x tp2 with sequence parallelism: a clean run, and a flip in a tp all-gather on rank 3;
#  - bad sites are one clear error each.
source "$(dirname "$0")/lib.sh"
make_data
write_config
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi() {
  timeout 240 mpirun --oversubscribe -np 2 "$LOCKSTEP" train --config cfg.toml --train.steps=6 --train.threads=1 \
    --parallel.dp=2 --parallel.zero=1 --parallel.timeout_s=60 "$@"
}
flip() { echo "--inject.site=comm/dp/$1 --inject.step=2 --inject.rank=1 --inject.kind=bitflip:bit=$2,index=$3,nth=$4"; }

mpi > plain.log 2>&1 || fail "plain run: $(tail -3 plain.log)"
mpi --verify.collectives=true > checked.log 2>&1 || fail "checked run: $(tail -3 checked.log)"
grep -q '^finding' checked.log && fail "a clean run reported: $(grep '^finding' checked.log)"
[ "$(model_hash plain.log)" = "$(model_hash checked.log)" ] || fail "the checks changed the model"

# The step's first all_to_allv to complete is the records' counts (three int64 copies per rank),
# the second the exact sums (one double per element of the shard).
# ZeRO-1's all_gatherv: the reduced gradient (nth 0), the loss (1), the updated parameters (2).
for what in "counts:$(flip all_to_allv 30 0 0)" "sums:$(flip all_to_allv 29 123 1)" "grads:$(flip all_gatherv 27 77 0)" \
            "params:$(flip all_gatherv 27 77 2)"; do
  name=${what%%:*}
  status=0
  mpi --verify.collectives=true ${what#*:} > $name.log 2>&1 || status=$?
  [ "$status" -eq 6 ] || fail "$name: expected exit 6, got $status: $(tail -3 $name.log)"
  op=$(case $name in grads | params) echo all_gatherv ;; *) echo all_to_allv ;; esac)
  grep -Eq "^finding: after step 3, detector collectives, site $op on dp, ranks 1: .*received blocks from world rank\(s\) 0 do not match" \
    $name.log || fail "$name: no finding naming the message: $(grep -E '^(finding|error)' $name.log)"
  status=0
  mpi ${what#*:} > ${name}_unchecked.log 2>&1 || status=$?
  case "$name:$status" in
    counts:0 | sums:0 | sums:7 | grads:0 | grads:6 | grads:7 | params:0 | params:6 | params:7) ;;
    *) fail "$name without the checks: exit $status (a crash, a hang or an error): $(tail -3 ${name}_unchecked.log)" ;;
  esac
done
mpi --verify.collectives=true --verify.on_fault=warn $(flip all_to_allv 29 123 1) > warn.log 2>&1 \
  || fail "warn: $(tail -3 warn.log)"
grep -q '^finding: after step 3, detector collectives' warn.log || fail "warn: no finding"
grep -q '^done: 6 steps' warn.log || fail "warn: the run did not finish"

status=0
mpi --verify.collectives=true --train.mode=fast --parallel.reduce=fast $(flip reduce_scatter 30 5 0) > fast.log 2>&1 || status=$?
[ "$status" -eq 6 ] || fail "fast reduce-scatter: expected exit 6, got $status: $(tail -3 fast.log)"
grep -Eq '^finding: after step 3, detector collectives, site reduce_scatter on dp, ranks 1: \|sum - checksums\| [0-9.e+]+ against bound [0-9.e+-]+ \(corruption\)' \
  fast.log || fail "fast: no finding against the reduction's bound: $(grep '^finding' fast.log)"

mpi4() {
  timeout 240 mpirun --oversubscribe -np 4 "$LOCKSTEP" train --config cfg.toml --train.steps=5 --train.threads=1 \
    --train.mode=fast --model.vocab_size=384 --parallel.dp=2 --parallel.tp=2 --parallel.sp=true \
    --parallel.timeout_s=60 --verify.collectives=true "$@"
}
mpi4 > tp.log 2>&1 || fail "dp2 x tp2: $(tail -3 tp.log)"
grep -q '^finding' tp.log && fail "dp2 x tp2 clean run reported: $(grep '^finding' tp.log)"
status=0
mpi4 --inject.site=comm/tp/all_gatherv --inject.step=2 --inject.rank=3 --inject.kind=bitflip:bit=28,index=9 \
  > tp_flip.log 2>&1 || status=$?
[ "$status" -eq 6 ] || fail "tp flip: expected exit 6, got $status: $(tail -3 tp_flip.log)"
grep -Eq '^finding: after step 3, detector collectives, site all_gatherv on tp, ranks 3: .*world rank\(s\) 2 ' tp_flip.log \
  || fail "tp flip: no finding naming rank 3 and its peer 2: $(grep '^finding' tp_flip.log)"

expect_error 'comm/pp/all_reduce: expected comm/GROUP/OP with GROUP dp, tp or cp' \
  "$LOCKSTEP" train --config cfg.toml --inject.site=comm/pp/all_reduce --inject.kind=bitflip:bit=1
expect_error 'comm/dp/alltoall: expected comm/GROUP/OP' \
  "$LOCKSTEP" train --config cfg.toml --inject.site=comm/dp/alltoall --inject.kind=bitflip:bit=1
expect_error 'site comm/dp/all_gatherv \(a received message\) takes kind bitflip' \
  "$LOCKSTEP" train --config cfg.toml --inject.site=comm/dp/all_gatherv --inject.kind=cast:bf16
expect_error 'nth is for comm/ sites' \
  "$LOCKSTEP" train --config cfg.toml --inject.site=param/lnf/weight --inject.kind=bitflip:bit=1,nth=2
echo "collectives: clean runs unchanged, corrupted messages found and named, none crashes or hangs"
