#!/usr/bin/env bash
# A fault in a checkpoint's bytes ([inject] site ckpt/tensors or ckpt/manifest: one bit of the file
# flipped on disk once written, as a storage fault would): the run that resumes refuses that
# checkpoint with a warning naming it, falls back to the one before, and ends on the model of a
# clean run, bitwise; a checkpoint site with no checkpoint after its step is refused in one line.
source "$(dirname "$0")/lib.sh"
make_data
write_config
run() { "$LOCKSTEP" train --config cfg.toml --train.steps=6 --checkpoint.every=2 "$@"; }
run --checkpoint.dir=clean > clean.log 2>&1 || fail "clean: $(tail -3 clean.log)"

declare -A file=([tensors]=tensors-00000.bin [manifest]=manifest.json)
for site in tensors manifest; do
  # Stopped after step 4, whose checkpoint the fault corrupts; the same command without stop_after
  # resumes.
  run --checkpoint.dir=ck_$site --train.stop_after=3 --inject.site=ckpt/$site --inject.step=3 \
    --inject.kind=bitflip:bit=5,index=100 > first_$site.log 2>&1 || fail "$site: $(tail -3 first_$site.log)"
  [ -d ck_$site/step_00000004 ] || fail "$site: no checkpoint of step 4: $(ls ck_$site)"
  run --checkpoint.dir=ck_$site > resumed_$site.log 2>&1 || fail "$site resumed: $(tail -3 resumed_$site.log)"
  grep -q "^warning: skipping checkpoint ck_$site/step_00000004: ck_$site/step_00000004/${file[$site]}: " \
    resumed_$site.log || fail "$site: no warning naming the file: $(head -3 resumed_$site.log)"
  grep -q '^resumed from .*step_00000002 (step 2; ' resumed_$site.log || fail "$site: did not fall back to step 2"
  [ "$(model_hash resumed_$site.log)" = "$(model_hash clean.log)" ] || fail "$site: not the clean run's model"
done

expect_error 'site ckpt/tensors: no checkpoint is written after step 2' "$LOCKSTEP" train --config cfg.toml \
  --train.steps=6 --checkpoint.dir=ck_none --checkpoint.every=2 --inject.site=ckpt/tensors --inject.step=2 \
  --inject.kind=bitflip:bit=0
expect_error 'site ckpt/state: expected ckpt/manifest' "$LOCKSTEP" train --config cfg.toml --train.steps=2 \
  --checkpoint.dir=ck_none --inject.site=ckpt/state --inject.step=1 --inject.kind=bitflip:bit=0
echo "checkpoint faults: a corrupted checkpoint is refused by name and the resume falls back to the one before, bitwise"
