#!/usr/bin/env bash
# Sharded checkpoints: every rank writes its share of what its tensor-parallel group holds — of its
# slice of parameters and AdamW moments, its ZeRO shard or an equal part between the replicas — into
# a data file of its own, so that no file is much larger than the whole over the ranks; world rank
# 0 writes the manifest. The resharding matrix: a checkpoint of step 2 written by each of {1 process,
# dp2, dp4 zero 2, tp2, dp2 x tp2 sp zero 1}, resumed by each of them, ends on the model hash of the
# uninterrupted single-process run, and `ckpt info` finds one model hash in all of them. A corrupted
# or missing shard of any rank is never loaded: the resume names the file, once, and falls back to
# the checkpoint before. A layout the checkpoint cannot go to, and another model, are one error line.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
# d_model 128 and a vocabulary of 384 keep tp2's split reductions on 64-element chunks.
write_tp_config 384 128
steps=4
layouts=(
  "one|1|"
  "dp2|2|--parallel.dp=2"
  "dp4z2|4|--parallel.dp=4 --parallel.zero=2"
  "tp2|2|--parallel.tp=2"
  "dp2tp2|4|--parallel.dp=2 --parallel.tp=2 --parallel.sp=true --parallel.zero=1"
)
launch() {  # NP FLAGS...: the training command on NP ranks
  local np=$1; shift
  if [ "$np" = 1 ]; then
    "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --train.threads=1 "$@"
  else
    mpirun --oversubscribe -np "$np" "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --train.threads=1 "$@"
  fi
}

launch 1 > full.log
want=$(model_hash full.log)
[ -n "$want" ] || fail "no model hash: $(tail -3 full.log)"

for a in "${layouts[@]}"; do
  IFS='|' read -r name np flags <<< "$a"
  # shellcheck disable=SC2086
  launch "$np" $flags --checkpoint.dir="ck_$name" --checkpoint.every=2 --checkpoint.keep=0 > "save_$name.log" 2>&1 ||
    fail "$name: $(tail -3 "save_$name.log")"
  [ "$(model_hash "save_$name.log")" = "$want" ] || fail "$name: the saving run's hash differs"
  "$LOCKSTEP" ckpt info "ck_$name/step_00000002" > "info_$name.log" || fail "$name: ckpt info: $(tail -3 "info_$name.log")"
  rm -rf "ck_$name/step_00000004"
  # ckpt info hashes the model from the loaded tensors: one hash for every layout at step 2.
  [ "$(model_hash "info_$name.log")" = "$(model_hash info_one.log)" ] || fail "$name: ckpt info's model hash differs"
done

# Who wrote what: one data file per rank, each within 5% of the whole state over the ranks (a
# ZeRO shard's edges fall inside tensors; each shard starts on 64 bytes).
/usr/bin/python3 - <<'PY' || fail "the files of the sharded checkpoints are not as expected"
import json
def files(name):
    m = json.load(open(f"ck_{name}/step_00000002/manifest.json"))
    return {f["name"]: f["bytes"] for f in m["files"]}, m
one, m1 = files("one")
whole = one["tensors-00000.bin"]
assert list(one) == ["tensors-00000.bin"] and "model_hash" in m1, (one, list(m1))
for name, ranks in [("dp2", 2), ("dp4z2", 4), ("tp2", 2), ("dp2tp2", 4)]:
    f, m = files(name)
    assert list(f) == [f"tensors-{r:05d}.bin" for r in range(ranks)], (name, f)
    for fname, size in f.items():
        assert 0.95 * whole / ranks <= size <= 1.05 * whole / ranks + 64 * 300, (name, fname, size, whole / ranks)
    assert ("model_hash" in m) == (name in ("dp2", "dp4z2")), (name, list(m))
    for t in m["tensors"]:
        n = 1
        for d in t["shape"]: n *= d
        assert sum(s["elements"][1] - s["elements"][0] for s in t["shards"]) == n, (name, t["name"])
    print(name, f)
PY

# Every checkpoint resumed by every layout: the uninterrupted run's model.
for a in "${layouts[@]}"; do
  IFS='|' read -r from _ _ <<< "$a"
  for b in "${layouts[@]}"; do
    IFS='|' read -r to np flags <<< "$b"
    rm -rf resume && cp -r "ck_$from" resume
    # shellcheck disable=SC2086
    launch "$np" $flags --checkpoint.dir=resume > "resume_${from}_$to.log" 2>&1 ||
      fail "$from -> $to: $(tail -3 "resume_${from}_$to.log")"
    grep -q '^resumed from .*step_00000002' "resume_${from}_$to.log" || fail "$from -> $to did not resume from step 2"
    [ "$(model_hash "resume_${from}_$to.log")" = "$want" ] ||
      fail "$from -> $to: model hash $(model_hash "resume_${from}_$to.log") != uninterrupted $want"
  done
done

# A shard of a rank other than 0 corrupted, then missing: the resume names it and takes step 2.
launch 4 --parallel.dp=2 --parallel.tp=2 --parallel.zero=1 --checkpoint.dir=ck_bad --checkpoint.every=2 --checkpoint.keep=0 > bad_save.log 2>&1 ||
  fail "dp2 x tp2 save: $(tail -3 bad_save.log)"
/usr/bin/python3 - ck_bad/step_00000004/tensors-00003.bin <<'PY'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[100] ^= 0x10
open(p, "wb").write(bytes(b))
PY
cp -r ck_bad ck_gone
rm ck_gone/step_00000004/tensors-00001.bin
for root in ck_bad ck_gone; do
  steps=5 launch 4 --parallel.dp=2 --parallel.tp=2 --parallel.zero=1 --checkpoint.dir=$root > "fallback_$root.log" 2>&1 ||
    fail "$root: $(tail -3 "fallback_$root.log")"
  grep -q '^resumed from .*step_00000002' "fallback_$root.log" || fail "$root: did not fall back to step 2"
done
grep -q "warning: skipping checkpoint .*ck_bad/step_00000004: .*tensors-00003.bin: checksum mismatch in tensor" fallback_ck_bad.log ||
  fail "corrupt shard not named: $(grep warning fallback_ck_bad.log)"
grep -q "warning: skipping checkpoint .*ck_gone/step_00000004: .*tensors-00001.bin: missing" fallback_ck_gone.log ||
  fail "missing shard not named: $(grep warning fallback_ck_gone.log)"
[ "$(grep -c 'warning: skipping checkpoint' fallback_ck_bad.log)" = 1 ] || fail "the warning is printed by more than one rank"
# Bad input: a layout the checkpoint cannot go to (tp 8 does not divide the 4 heads) and a checkpoint
# of another model, one error line each.
mpi() { mpirun --oversubscribe -np 8 "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --train.threads=1 "$@"; }
expect_mpi_error 'cfg.toml: \[model\] n_heads \(4\) must be a multiple of \[parallel\] tp \(8\)' --parallel.tp=8 \
  --checkpoint.dir=ck_one
expect_error 'ck_one/step_00000002: cannot resume: it was written with \[model\] d_model = 128, this run has 64' \
  launch 1 --checkpoint.dir=ck_one --model.d_model=64
echo "PASS: sharded checkpoints, resharding matrix 5 x 5"
