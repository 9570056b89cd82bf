#!/usr/bin/env bash
# Retention and integrity: [checkpoint] keep_every keeps the checkpoints of steps that are multiples
# of it beside the `keep` newest; `lockstep ckpt verify ROOT` loads every checkpoint under a root and
# says, one line each, which are whole — a flipped byte in a shard, a truncated data file and a
# missing manifest each named with the file — and exits 1 when any is not; the resume takes the
# newest that is.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
args=(--config cfg.toml --train.threads=1 --checkpoint.dir=ck --checkpoint.every=1 --checkpoint.keep=2)
mpirun --oversubscribe -np 2 "$LOCKSTEP" train "${args[@]}" --train.steps=7 --parallel.dp=2 --parallel.zero=1 \
  --checkpoint.keep_every=3 > run.log 2>&1 || fail "training: $(tail -3 run.log)"
[ "$(ls ck | tr '\n' ' ')" = "step_00000003 step_00000005 step_00000006 step_00000007 " ] ||
  fail "keep 2, keep_every 3: expected steps 3 5 6 7, got $(ls ck | tr '\n' ' ')"

"$LOCKSTEP" ckpt verify ck > ok.log || fail "verify of whole checkpoints failed: $(cat ok.log)"
[ "$(grep -c '^ok ck/step_' ok.log)" = 4 ] || fail "expected 4 ok lines: $(cat ok.log)"
grep -q '^verified 4 checkpoints: 4 ok, 0 failed$' ok.log || fail "no summary: $(tail -1 ok.log)"

/usr/bin/python3 - <<'PY'
import json
m = json.load(open("ck/step_00000007/manifest.json"))
shard = m["tensors"][0]["shards"][0]
p = "ck/step_00000007/" + shard["file"]
b = bytearray(open(p, "rb").read())
b[shard["offset"] + 3] ^= 0x01
open(p, "wb").write(bytes(b))
PY
truncate -s -100 ck/step_00000006/tensors-00001.bin
rm ck/step_00000003/manifest.json
status=0
"$LOCKSTEP" ckpt verify ck > bad.log || status=$?
[ "$status" = 1 ] || fail "verify of damaged checkpoints exited $status, expected 1: $(cat bad.log)"
grep -q '^FAILED ck/step_00000007: .*tensors-0000[01].bin: checksum mismatch in tensor' bad.log || fail "flipped byte: $(cat bad.log)"
grep -q '^FAILED ck/step_00000006: .*tensors-00001.bin: truncated' bad.log || fail "truncated file: $(cat bad.log)"
grep -q '^FAILED ck/step_00000003: .*manifest.json: missing' bad.log || fail "missing manifest: $(cat bad.log)"
grep -q '^ok ck/step_00000005 ' bad.log || fail "the whole checkpoint is not ok: $(cat bad.log)"
grep -q '^verified 4 checkpoints: 1 ok, 3 failed$' bad.log || fail "summary: $(tail -1 bad.log)"
"$LOCKSTEP" ckpt verify ck/step_00000005 > one.log || fail "verify of one checkpoint: $(cat one.log)"
grep -q '^verified 1 checkpoint: 1 ok, 0 failed$' one.log || fail "one checkpoint: $(cat one.log)"

# The resume takes step 5, naming the two newer ones it skips.
mpirun --oversubscribe -np 2 "$LOCKSTEP" train "${args[@]}" --train.steps=8 --parallel.dp=2 > resume.log 2>&1 ||
  fail "resume: $(tail -3 resume.log)"
grep -q '^resumed from ck/step_00000005' resume.log || fail "did not resume from step 5: $(grep -i 'resumed\|warning' resume.log)"
[ "$(grep -c '^warning: skipping checkpoint' resume.log)" = 2 ] || fail "expected two skip warnings: $(grep warning resume.log)"

expect_error 'lockstep ckpt verify: nothere: no such directory' "$LOCKSTEP" ckpt verify nothere
expect_error 'cfg.toml: \[checkpoint\] every, keep and keep_every must be >= 0' \
  "$LOCKSTEP" train --config cfg.toml --checkpoint.keep_every=-1
echo PASS
