# `lockstep bench` on bench_small: two timed steps after one warm-up, on synthetic tokens (the
# config has no [data] section); the JSON report carries the documented fields with sane values.
# No timing assertions: only that the figures are finite and positive.
source "$(dirname "$0")/lib.sh"

"$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.steps=2 --bench.warmup=1 \
  --json out.json > bench.log || fail "lockstep bench failed: $(cat bench.log)"
grep -q '^throughput: ' bench.log || fail "no throughput line: $(cat bench.log)"
grep -q 'synthetic uniform tokens' bench.log || fail "synthetic tokens not reported: $(cat bench.log)"

/usr/bin/python3 - out.json <<'PY' || fail "bad JSON report: $(cat out.json)"
import json, math, sys
r = json.load(open(sys.argv[1]))
for key in ("tokens_per_s", "mfu", "step_ms_median", "peak_gflops", "flops_per_token", "peak_memory_mib"):
    v = r[key]
    assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (key, v)
assert r["tokens_per_step"] == 8 * 128, r["tokens_per_step"]
assert r["synthetic_tokens"] is True
assert r["mode"] == "canonical"
assert isinstance(r["openblas_core"], str) and r["openblas_core"], r["openblas_core"]
phases = r["phases_ms"]
assert set(phases) == {"forward", "backward", "optimizer", "communication", "verification"}, phases
assert phases["communication"] == 0 and phases["verification"] == 0, phases
s = r["step_ms"]
assert s["min"] <= s["q1"] <= s["median"] <= s["q3"] <= s["max"], s
assert math.isfinite(r["last_loss"]) and r["last_loss"] > 0
PY

# Bad options are one-line errors (exit 2).
expect_error "bench.steps: expected a non-negative integer" \
  "$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.steps=x
expect_error "bench.steps \\(0\\) must be >= 1" \
  "$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.steps=0
# Only bench may run without [data] train; training still requires a token file.
expect_error "\\[data\\] train: a token file is required" \
  "$LOCKSTEP" train --config "$SRC/scripts/configs/bench_small.toml"
echo "bench_smoke: ok"
