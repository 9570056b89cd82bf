#!/usr/bin/env bash
# Slow ranks ([verify] stragglers): a rank whose steps take 30 ms longer ([inject] kind slow,
# persistent) is named in one finding — a line and a JSONL record — after straggler_patience
# windows, with its compute time against the median rank's; a clean run of the same layout has
# none, on four ranks sharing two cores.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_tp_config 384 128
mpi() { mpirun --oversubscribe -np 4 "$LOCKSTEP" train --config cfg.toml --train.threads=1 --train.steps=60 \
  --parallel.dp=2 --parallel.tp=2 --parallel.timeout_s=60 --verify.straggler_window=10 --verify.straggler_patience=2 "$@"; }
mpi --log.metrics=clean.jsonl > clean.log 2>&1 || fail "clean run: $(tail -3 clean.log)"
! grep -q 'straggler' clean.log clean.jsonl || fail "a clean run has a straggler finding: $(grep straggler clean.log)"
mpi --log.metrics=slow.jsonl --inject.kind=slow:ms=30 --inject.rank=2 --inject.step=0 --inject.persistent=true \
  > slow.log 2>&1 || fail "slow run: $(tail -3 slow.log)"
[ "$(grep -c '^finding: .*detector straggler' slow.log)" = 1 ] || fail "expected one straggler finding: $(grep finding slow.log)"
grep -q '^finding: after step 20, detector straggler, site step compute time, ranks 2: ' slow.log ||
  fail "the finding does not name rank 2 after two windows: $(grep finding slow.log)"
/usr/bin/python3 - slow.jsonl <<'PY' || fail "no JSONL record of the straggler"
import json, sys
rs = [json.loads(l)["finding"] for l in open(sys.argv[1]) if '"straggler"' in l]
assert len(rs) == 1 and rs[0]["ranks"] == [2] and rs[0]["magnitude"] > rs[0]["bound"] == 1.25, rs
PY
[ "$(model_hash slow.log)" = "$(model_hash clean.log)" ] || fail "a slow rank changed the model"
expect_error 'cfg.toml: \[inject\] kind slow: ms=N with N >= 0 is required' \
  "$LOCKSTEP" train --config cfg.toml --inject.kind=slow:ms=-4
echo PASS
