#!/usr/bin/env bash
# Bad input gets one clear error line naming the file, the field and the expectation, exit 2;
# a corrupt newest checkpoint is skipped with a warning, and nothing already written is lost.
source "$(dirname "$0")/lib.sh"
make_data
write_config

sed 's/^lr = /lrr = /' cfg.toml > unknown_key.toml
expect_error "unknown_key.toml: \[train\] unknown key 'lrr'" "$LOCKSTEP" train --config unknown_key.toml

sed 's/^steps = 40/steps = "forty"/' cfg.toml > wrong_type.toml
expect_error "wrong_type.toml: \[train\] steps: expected an integer" "$LOCKSTEP" train --config wrong_type.toml

expect_error "--train.lr: expected a number, got 'fast'" "$LOCKSTEP" train --config cfg.toml --train.lr=fast
expect_error "--model.colour: unknown key 'colour'" "$LOCKSTEP" train --config cfg.toml --model.colour=red
expect_error "unknown section 'trian'" "$LOCKSTEP" train --config cfg.toml --trian.lr=1
# [inject]: process faults take no site, parameter sites must name a parameter, order needs an op.
expect_error "\[inject\] kind exit takes no options and no site" "$LOCKSTEP" train --config cfg.toml \
  --inject.kind=exit --inject.site=logits
expect_error "\[inject\] site param/lnf/wieght: the model has no parameter lnf/wieght" "$LOCKSTEP" train \
  --config cfg.toml --inject.kind=bitflip:bit=3 --inject.site=param/lnf/wieght
expect_error "kind order: site must be an op's forward output \(embed/out, layer/N/ln1/out, layer/N/attn/qkv, " \
  "$LOCKSTEP" train --config cfg.toml --inject.kind=order --inject.site=layer/0/attn/out
expect_error "d_model \(64\) must be divisible by n_heads \(5\)" "$LOCKSTEP" train --config cfg.toml --model.n_heads=5
expect_error "cfg.toml: \[train\] weight_decay_on: unknown parameter class \"gains\" in \"matrices,gains\"" \
  "$LOCKSTEP" train --config cfg.toml --train.weight_decay_on=matrices,gains
expect_error "cfg.toml: \[verify\] on_fault: expected \"rollback\", \"stop\" or \"warn\", got \"explode\"" \
  "$LOCKSTEP" train --config cfg.toml --verify.on_fault=explode
expect_error "cfg.toml: \[verify\] on_spike: \"rollback\" is for faults \(on_fault\)" \
  "$LOCKSTEP" train --config cfg.toml --verify.on_spike=rollback
expect_error "cfg.toml: \[verify\] max_replays \(0\) must be >= 1" "$LOCKSTEP" train --config cfg.toml \
  --verify.on_fault=rollback --verify.max_replays=0
expect_error "cfg.toml: \[verify\] spike_window \(0\) must be >= 10 steps" "$LOCKSTEP" train --config cfg.toml \
  --verify.spike_window=0
expect_error "--verify.abtf: unknown key 'abtf'" "$LOCKSTEP" train --config cfg.toml --verify.abtf=true
expect_error "cfg.toml: \[parallel\] check_replicas is now \[verify\] replicas" "$LOCKSTEP" train --config cfg.toml \
  --parallel.check_replicas=true
expect_error "\[parallel\] bucket_mb \(0\) must be > 0" "$LOCKSTEP" train --config cfg.toml --parallel.bucket_mb=0
expect_error "cfg.toml: \[train\] fast_gemm: expected \"auto\", \"openblas\" or \"lockstep\", got \"mkl\"" \
  "$LOCKSTEP" train --config cfg.toml --train.fast_gemm=mkl
expect_error "missing.toml" "$LOCKSTEP" train --config missing.toml
printf '[model\nseq_len = 3\n' > syntax.toml
expect_error "syntax.toml:1:" "$LOCKSTEP" train --config syntax.toml

expect_error "data/nope.bin" "$LOCKSTEP" train --config cfg.toml --data.train=data/nope.bin
head -c 5000 data/train.bin > truncated.bin
expect_error "truncated.bin.*truncated" "$LOCKSTEP" train --config cfg.toml --data.train=truncated.bin
cp data/train.bin badmagic.bin
printf '\x01\x02\x03\x04' | dd of=badmagic.bin bs=1 seek=0 conv=notrunc 2>/dev/null
expect_error "badmagic.bin.*magic" "$LOCKSTEP" train --config cfg.toml --data.train=badmagic.bin

# Checkpoints: a truncated tensor file in the newest checkpoint is reported by `ckpt info` and
# skipped, with a warning, by a resuming run, which continues from the previous one.
"$LOCKSTEP" train --config cfg.toml --train.steps=4 --checkpoint.dir=ck --checkpoint.every=2 > run1.log
newest=ck/step_00000004
[ -d "$newest" ] || fail "no $newest"
victim=$(find "$newest" -type f ! -name manifest.json | head -1)
truncate -s 100 "$victim"
expect_error "step_00000004" "$LOCKSTEP" ckpt info "$newest"
"$LOCKSTEP" train --config cfg.toml --train.steps=6 --checkpoint.dir=ck --checkpoint.every=2 > run2.log
grep -q "step_00000004" run2.log || fail "no warning naming the corrupt checkpoint: $(head -5 run2.log)"
grep -q "resumed from .*step_00000002" run2.log || fail "did not resume from step 2: $(head -5 run2.log)"
[ -d ck/step_00000006 ] || fail "resumed run wrote no step 6 checkpoint"
echo "errors: all rejected with one clear line"
