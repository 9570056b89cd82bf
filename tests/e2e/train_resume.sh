#!/usr/bin/env bash
# A run killed (SIGKILL) mid-way and restarted with the same command resumes from its newest
# checkpoint and ends with a model hash bitwise equal to the uninterrupted run's (canonical mode).
source "$(dirname "$0")/lib.sh"
make_data
write_config

"$LOCKSTEP" train --config cfg.toml --checkpoint.dir=a > a.log
hash_a=$(model_hash a.log)
[ -n "$hash_a" ] || fail "no model hash in a.log"

"$LOCKSTEP" train --config cfg.toml --checkpoint.dir=b --checkpoint.every=2 > b1.log &
pid=$!
for _ in $(seq 1 2000); do
  [ -d b/step_00000006 ] && break
  sleep 0.01
done
kill -9 "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
grep -q '^done:' b1.log && fail "the run finished before it could be killed; make steps slower"
[ -d b/step_00000006 ] || fail "no checkpoint b/step_00000006 before the kill"

"$LOCKSTEP" train --config cfg.toml --checkpoint.dir=b --checkpoint.every=2 > b2.log
grep -q '^resumed from ' b2.log || fail "second run did not resume: $(head -3 b2.log)"
hash_b=$(model_hash b2.log)
[ "$hash_a" = "$hash_b" ] || fail "resumed run's model hash $hash_b != uninterrupted $hash_a"

# `ckpt info` on the checkpoint root reports the same model hash.
"$LOCKSTEP" ckpt info b > info.log
[ "$(model_hash info.log)" = "$hash_a" ] || fail "ckpt info hash $(model_hash info.log) != $hash_a"
echo "resume: model hash $hash_a after kill at $(ls b | tail -1)"
