#!/usr/bin/env bash
# `lockstep bisect` on planted divergences: a bit flip in one op's output, a different accumulation
# order in one op (`order`: that op's forward in fast mode) and a bf16 cast of one layer's tensor,
# each at a chosen step; bisect must name exactly that step and op (exit 1), re-run at most
# 2·every + 2 steps beyond one pass of each side, and leave a report. Two runs that agree bitwise
# (threads 1 vs 2 in canonical mode) give exit 0.
source "$(dirname "$0")/lib.sh"
make_data
write_config

steps=10  # every = round(sqrt(10)) = 3: scan checkpoints at 3, 6, 9
a='--config cfg.toml --train.threads=1'

# plant NAME SITE STEP KIND [EXPECTED_OP]: bisect must report STEP and EXPECTED_OP (default SITE).
plant() {
  local name=$1 site=$2 step=$3 kind=$4 op=${5:-$2}
  local status=0
  "$LOCKSTEP" bisect --a="$a" --b="$a --inject.site=$site --inject.step=$step --inject.kind=$kind" \
    --steps=$steps --out="$name" > "$name.txt" 2> "$name.err" || status=$?
  [ "$status" -eq 1 ] || fail "$name: expected exit 1 (divergence found), got $status: $(cat "$name.txt" "$name.err")"
  /usr/bin/python3 - "$name/bisect.json" "$step" "$op" "$steps" <<'PY' || fail "$name: $(head -3 "$name.txt")"
import json, sys
path, step, op, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
r = json.load(open(path))
assert r["diverged"] and r["step"] == step, ("step", r["step"], step)
assert r["op"] == op, ("op", r["op"], op)
assert all(i["status"] == "bitwise equal" for i in r["op_detail"]["inputs"]), r["op_detail"]["inputs"]
assert r["op_detail"]["output"]["mismatches"] > 0
assert not r["warnings"], r["warnings"]
# Never re-run from zero per probe: one pass of each side, then at most every steps per side to
# refine and one step per side to dump.
assert r["steps_reexecuted"] <= 2 * r["every"] + 2, r["steps_reexecuted"]
assert r["steps_executed"] == sum(x["steps_executed"] for x in r["runs"])
assert [x["phase"] for x in r["runs"]][-2:] == ["dump", "dump"]
PY
  grep -q "first divergent step $step " "$name.txt" || fail "$name: summary does not name step $step: $(cat "$name.txt")"
  grep -q "## Result: step $step, op \`$op\`" "$name/bisect-report.md" || fail "$name: report lacks the result"
  # The dumps the report points at show the same first divergent tensor.
  status=0
  "$LOCKSTEP" diff "$name/a/dump/dump" "$name/b/dump/dump" > "$name.diff" || status=$?
  [ "$status" -eq 1 ] && grep -q "first divergent tensor step/$step/$op " "$name.diff" ||
    fail "$name: diff of the dumps: $(head -1 "$name.diff")"
}

plant flip layer/1/mlp/res 7 bitflip:bit=27
plant order layer/0/attn/att 4 order
plant cast layer/1/mlp/fc 5 cast:bf16
plant gradflip grad/layer/0/mlp/act 2 bitflip:bit=30,index=5

# No divergence: thread counts do not change canonical bits.
status=0
"$LOCKSTEP" bisect --a="$a" --b='--config cfg.toml --train.threads=2' --a-bin="$LOCKSTEP" --b-bin="$LOCKSTEP" \
  --steps=$steps --out=same > same.txt 2>&1 ||
  status=$?
[ "$status" -eq 0 ] || fail "threads 1 vs 2: expected exit 0 (no divergence), got $status: $(cat same.txt)"
grep -q 'no divergence' same.txt || fail "threads 1 vs 2: $(cat same.txt)"
grep -q '"steps_reexecuted": 0' same/bisect.json || fail "no divergence should re-run nothing: $(cat same/bisect.json)"

# Bad input: exit 2 with one error line naming the problem.
expect_error "--a='TRAIN ARGS' is required" "$LOCKSTEP" bisect --b="$a" --steps=3
expect_error 'steps=N is required' "$LOCKSTEP" bisect --a="$a" --b="$a"
expect_error 'side B sets --checkpoint.dir, which bisect sets itself' \
  "$LOCKSTEP" bisect --a="$a" --b="$a --checkpoint.dir=x" --steps=3 --out=bad1
expect_error "--b: unterminated ' in" "$LOCKSTEP" bisect --a="$a" --b="--config 'cfg.toml" --steps=3 --out=bad2
expect_error 'side A has no --config FILE' "$LOCKSTEP" bisect --a='--train.steps2=1' --b="$a" --steps=3 --out=bad3
expect_error 'already holds a bisect' "$LOCKSTEP" bisect --a="$a" --b="$a" --steps=3 --out=same
expect_error 'b-bin ./nothere is not an executable file' "$LOCKSTEP" bisect --a="$a" --b="$a" --b-bin=./nothere \
  --steps=3 --out=bad6
expect_error 'b-np expects a rank count' "$LOCKSTEP" bisect --a="$a" --b="$a" --b-np=0 --steps=3 --out=bad4
# A side that cannot run: exit 2, naming the side, its log and the trainer's own error.
status=0
"$LOCKSTEP" bisect --a="$a" --b='--config nothere.toml' --steps=3 --out=bad5 > bad5.txt 2> bad5.err || status=$?
[ "$status" -eq 2 ] || fail "failing side: expected exit 2, got $status"
grep -q '^error: side B scan run failed .*bad5/b/scan/train.log' bad5.err || fail "failing side: $(cat bad5.err)"
grep -q 'nothere.toml' bad5.err || fail "failing side: the trainer's error is not shown: $(cat bad5.err)"
echo "bisect_planted: bit flip, order, bf16 cast and gradient bit flip named at their step and op; no divergence across threads"
