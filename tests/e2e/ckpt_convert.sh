#!/usr/bin/env bash
# lockstep ckpt convert: a dp4 zero 2 checkpoint rewritten offline as dp1 x tp2 and as dp2 x tp2 with
# sp and zero 1 — one data file per rank of the target, the same tensors and model hash, verified
# whole — resumes in that layout to the uninterrupted single-process model hash, each rank reading
# less than it reads from the unconverted checkpoint. A layout the model does not divide, a malformed
# layout, an axis that is not there yet and an output root holding the step are one error line each.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_tp_config 384 128
train=("$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=20)
"${train[@]}" > full.log
want=$(model_hash full.log)
mpirun --oversubscribe -np 4 "${train[@]}" --parallel.dp=4 --parallel.zero=2 --checkpoint.dir=ck \
  --checkpoint.every=10 --train.stop_after=9 > first.log 2>&1 || fail "dp4 zero 2 run: $(tail -3 first.log)"
source_hash=$("$LOCKSTEP" ckpt info ck | awk '/^model hash/ {print $3}')

read_mb() { sed -n 's/^resumed from .*rank 0 read \([0-9.]*\) MB.*/\1/p' "$1"; }
cp -r ck plain
mpirun --oversubscribe -np 2 "${train[@]}" --parallel.tp=2 --checkpoint.dir=plain > plain.log 2>&1 ||
  fail "resume tp2 from the dp4 checkpoint: $(tail -3 plain.log)"

for target in "dp=1,tp=2|2|--parallel.tp=2" "dp=2,tp=2,sp=true,zero=1|4|--parallel.dp=2 --parallel.tp=2 --parallel.sp=true --parallel.zero=1"; do
  IFS='|' read -r layout ranks flags <<< "$target"
  out="cv_${ranks}"
  "$LOCKSTEP" ckpt convert ck --to-layout "$layout" "$out" > "$out.txt" || fail "convert to $layout: $(cat "$out.txt")"
  grep -q "^converted step 10 to $layout: $out/step_00000010 ($ranks data files, .*; model hash $source_hash)$" "$out.txt" ||
    fail "convert to $layout: $(cat "$out.txt")"
  [ "$(ls "$out"/step_00000010/tensors-*.bin | wc -l)" = "$ranks" ] || fail "$layout: not $ranks data files"
  "$LOCKSTEP" ckpt verify "$out" | grep -q "^ok .*model hash $source_hash)$" || fail "$layout: ckpt verify"
  /usr/bin/python3 - "$out/step_00000010/manifest.json" "$layout" <<'PY' || fail "$layout: manifest"
import json, sys
m = json.load(open(sys.argv[1]))
want = dict(kv.split("=") for kv in sys.argv[2].split(","))
lay = m["state"]["layout"]
assert m["layout"]["dp"] == int(want["dp"]) and m["layout"]["tp"] == int(want["tp"]), m["layout"]
assert lay["dp"] == int(want["dp"]) and lay["tp"] == int(want["tp"]), lay
assert m["state"]["config"]["parallel"]["tp"] == int(want["tp"]), m["state"]["config"]["parallel"]
assert ("tp_shards" in lay) == (int(want["tp"]) > 1), lay
PY
  # shellcheck disable=SC2086
  mpirun --oversubscribe -np "$ranks" "${train[@]}" $flags --checkpoint.dir="$out" > "$out.log" 2>&1 ||
    fail "resume $layout: $(tail -3 "$out.log")"
  grep -q '^resumed from .*step 10' "$out.log" || fail "$layout: not resumed from step 10: $(grep resumed "$out.log")"
  [ "$(model_hash "$out.log")" = "$want" ] || fail "$layout: hash $(model_hash "$out.log") != $want"
done
# A tp2 rank reads only its own file from the converted checkpoint.
/usr/bin/python3 -c "import sys; a, b = map(float, sys.argv[1:]); assert a < b, (a, b)" "$(read_mb cv_2.log)" \
  "$(read_mb plain.log)" || fail "rank 0 read $(read_mb cv_2.log) MB converted, $(read_mb plain.log) MB not"

# Back to dp4 zero 2: the same tensors.
"$LOCKSTEP" ckpt convert cv_4/step_00000010 --to-layout dp=4,tp=1,sp=false,zero=2 back > /dev/null
diff <("$LOCKSTEP" ckpt info ck | grep -v '^checkpoint ') <("$LOCKSTEP" ckpt info back | grep -v '^checkpoint ') ||
  fail "converted there and back, the checkpoint differs"

expect_error "--to-layout tp=3: .*n_heads" "$LOCKSTEP" ckpt convert ck --to-layout tp=3 bad
expect_error "--to-layout dp2: expected key=value items of dp, tp, sp, zero and ep .*'dp2' is not one" \
  "$LOCKSTEP" ckpt convert ck --to-layout dp2 bad
expect_error "--to-layout pp=2,tp=1: expected key=value items .*'pp=2' is not one" \
  "$LOCKSTEP" ckpt convert ck --to-layout pp=2,tp=1 bad
expect_error "--to-layout dp=3: .*batch_size" "$LOCKSTEP" ckpt convert ck --to-layout dp=3 bad
expect_error "cv_2: already holds step_00000010" "$LOCKSTEP" ckpt convert ck --to-layout tp=2 cv_2
expect_error "lockstep ckpt convert: --to-layout .* is required" "$LOCKSTEP" ckpt convert ck bad
[ ! -e bad ] || [ -z "$(ls -A bad)" ] || fail "a refused conversion left files in bad/: $(ls -A bad)"
echo PASS
