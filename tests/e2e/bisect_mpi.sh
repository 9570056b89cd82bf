#!/usr/bin/env bash
# `lockstep bisect` with a multi-rank side: A on one process, B on two ranks under mpirun
# (--b-np=2), data-parallel or tensor-parallel. Canonical mode (exact reduction) is
# layout-invariant, so bisect finds no divergence (exit 0); a bit flip planted on the dp2 side is
# found at its step (exit 1).
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
a='--config cfg.toml --train.threads=1 --parallel.timeout_s=60'

status=0
"$LOCKSTEP" bisect --a="$a" --b="$a" --b-np=2 --steps=6 --out=same > same.txt 2> same.err || status=$?
[ "$status" -eq 0 ] || fail "1 rank vs dp2: expected exit 0 (no divergence), got $status: $(cat same.txt same.err)"
grep -q 'no divergence' same.txt || fail "1 rank vs dp2: $(cat same.txt)"
grep -q "^mpirun --oversubscribe -np 2 .* train $a" same/bisect-report.md || fail "report lacks the dp2 command"

# tp = 2 in canonical mode needs d_model / 2 and vocab_size / 2 on chunk boundaries (64).
t="$a --model.vocab_size=384 --model.d_model=128"
status=0
"$LOCKSTEP" bisect --a="$t" --b="$t --parallel.tp=2" --b-np=2 --steps=4 --out=tp > tp.txt 2> tp.err || status=$?
[ "$status" -eq 0 ] || fail "1 rank vs tp2: expected exit 0 (no divergence), got $status: $(cat tp.txt tp.err)"

status=0
"$LOCKSTEP" bisect --a="$a" --b="$a --inject.site=layer/1/mlp/res --inject.step=3 --inject.kind=bitflip:bit=27" \
  --b-np=2 --steps=6 --out=flip > flip.txt 2> flip.err || status=$?
[ "$status" -eq 1 ] || fail "dp2 bit flip: expected exit 1, got $status: $(cat flip.txt flip.err)"
/usr/bin/python3 - flip/bisect.json <<'PY' || fail "dp2 bit flip: $(cat flip.txt)"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["diverged"] and r["step"] == 3, r["step"]
# The dp2 side's dump holds the global batch (gathered over dp), so the op is named.
assert r["op"] == "layer/1/mlp/res", (r["op"], r["op_note"])
PY
expect_error 'launcher "srun -n 2" must contain \{np\}' \
  "$LOCKSTEP" bisect --a="$a" --b="$a" --b-np=2 --launcher='srun -n 2' --steps=3 --out=bad
echo "bisect_mpi: 1 rank vs dp2 and vs tp2 agree; a bit flip on the dp2 side found at step 3, op layer/1/mlp/res"
