#!/usr/bin/env bash
# Canonical mode: two runs give bitwise identical checkpoints (every tensor, optimizer state
# included), and the thread count does not change a bit.
source "$(dirname "$0")/lib.sh"
make_data
write_config
common=(--train.steps=12 --train.micro_batch_size=2)

"$LOCKSTEP" train --config cfg.toml "${common[@]}" --checkpoint.dir=r1 --train.threads=2 > r1.log
"$LOCKSTEP" train --config cfg.toml "${common[@]}" --checkpoint.dir=r2 --train.threads=2 > r2.log
"$LOCKSTEP" train --config cfg.toml "${common[@]}" --checkpoint.dir=r3 --train.threads=1 > r3.log
"$LOCKSTEP" train --config cfg.toml "${common[@]}" --checkpoint.dir=r4 --train.threads=3 > r4.log

"$LOCKSTEP" ckpt info r1 | grep -v '^checkpoint\|^dir' > i1.log
# The SIMD width does not change a bit either (AVX2 kernels on an AVX-512 machine).
if grep -q avx512f /proc/cpuinfo; then
  "$LOCKSTEP" train --config cfg.toml "${common[@]}" --checkpoint.dir=r6 --train.isa=avx2 > r6.log
  grep -q ', avx2;' r6.log || fail "run r6 did not use the AVX2 kernels: $(head -2 r6.log)"
  runs="r2 r3 r4 r6"
else
  runs="r2 r3 r4"
fi
for r in $runs; do
  "$LOCKSTEP" ckpt info $r | grep -v '^checkpoint\|^dir' > i_$r.log
  diff -q i1.log i_$r.log >/dev/null || fail "checkpoint $r differs from r1: $(diff i1.log i_$r.log | head -5)"
done
# Gradient accumulation over micro-batches is exact too: one micro-batch of 8 == four of 2.
"$LOCKSTEP" train --config cfg.toml --train.steps=12 --train.micro_batch_size=8 --checkpoint.dir=r5 > r5.log
[ "$(model_hash r5.log)" = "$(model_hash r1.log)" ] || fail "micro-batch split changed the model hash"
# Fast mode is a different (documented) numerics path: it must train, but need not match.
"$LOCKSTEP" train --config cfg.toml "${common[@]}" --train.mode=fast > f.log
grep -q '^model hash ' f.log || fail "fast mode did not finish"
echo "determinism: $(model_hash r1.log) for threads 1/2/3, AVX2/AVX-512, repeated runs and micro-batch 2/8"
