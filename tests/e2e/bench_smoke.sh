# `lockstep bench` on bench_small: two timed steps after one warm-up, on synthetic tokens (the
# config has no [data] section); the JSON report carries the documented fields with sane values,
# and --tokens-out writes the three batches the steps used; fast mode names the GEMM it runs; a run
# against a baseline in one process (--bench.against).
# No timing assertions: only that the figures are finite and positive.
source "$(dirname "$0")/lib.sh"

"$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.steps=2 --bench.warmup=1 \
  --json out.json --tokens-out tokens.bin > bench.log || fail "lockstep bench failed: $(cat bench.log)"
[ "$(stat -c %s tokens.bin)" -eq $((3 * 2 * 8 * 128 * 4)) ] || fail "tokens.bin is $(stat -c %s tokens.bin) bytes"
grep -q '^throughput: ' bench.log || fail "no throughput line: $(cat bench.log)"
grep -q 'synthetic uniform tokens' bench.log || fail "synthetic tokens not reported: $(cat bench.log)"

/usr/bin/python3 - out.json tokens.bin <<'PY' || fail "bad JSON report: $(cat out.json)"
import json, math, sys
r = json.load(open(sys.argv[1]))
for key in ("tokens_per_s", "mfu", "step_ms_median", "peak_gflops", "flops_per_token", "peak_memory_mib"):
    v = r[key]
    assert isinstance(v, (int, float)) and math.isfinite(v) and v > 0, (key, v)
assert r["tokens_per_step"] == 8 * 128, r["tokens_per_step"]
assert r["synthetic_tokens"] is True
assert r["mode"] == "canonical"
assert isinstance(r["openblas_core"], str) and r["openblas_core"], r["openblas_core"]
# The peak is the fastest of the three GEMMs timed in the process, and the report names it.
gemms = {"OpenBLAS sgemm": r["peak_openblas_gflops"], "Lockstep canonical GEMM": r["peak_canonical_gflops"],
         "Lockstep fast GEMM": r["peak_lockstep_fast_gflops"]}
assert r["peak_gflops"] == max(gemms.values()), r
assert min(gemms.values()) > 0, r
fastest = max(gemms, key=gemms.get)
assert r["peak_source"].startswith("measured: the fastest of OpenBLAS sgemm (" + r["openblas_core"] + ")"), r
assert fastest in open("bench.log").read().split("throughput: ")[1], fastest
# Fast mode's GEMM and the bf16 products' kernel are the faster of their candidates as timed at
# start-up, and named with both figures.
assert r["fast_gemm"].startswith("OpenBLAS sgemm (" + r["openblas_core"] + ")") or (
    r["fast_gemm"].startswith("Lockstep fast GEMM (")), r["fast_gemm"]
import re
log = open("bench.log").read()
m = re.search(r"kernels: fast mode's GEMM (.*?) \(([0-9.]+) GFLOP/s measured; .*? ([0-9.]+)\)", log)
assert m and m.group(1) == r["fast_gemm"] and float(m.group(2)) >= float(m.group(3)), log
m = re.search(r"bf16 products (.*?) \(([0-9.]+) GFLOP/s measured; .*? ([0-9.]+)\)", log)
assert (m is None) == (r["peak_bf16_dot_gflops"] == 0), (log, r["peak_bf16_dot_gflops"])
assert m is None or (m.group(1) == r["bf16_kernel"] and float(m.group(2)) >= float(m.group(3))), log
assert isinstance(r["step_page_faults"], int) and r["step_page_faults"] >= 0, r["step_page_faults"]
phases = r["phases_ms"]
assert set(phases) == {"forward", "backward", "optimizer", "communication", "verification"}, phases
assert phases["communication"] == 0, phases
# Verification: each detector timed at its default interval (every step): the replica check's hash,
# the numeric monitors and the state at rest; the phase is their sum.
v = r["verification"]
rh, nm = v["replica_hash"], v["numeric_monitors"]
assert rh["interval_steps"] == nm["interval_steps"] == 1, v
assert rh["ms"]["median"] > 0 and nm["ms"]["median"] > 0, v
sr = v["state_at_rest"]
assert sr["interval_steps"] == 1 and sr["ms"]["median"] > 0 and 0 < sr["fraction_of_step"] < 1, v
assert phases["verification"] == rh["ms"]["median"] + nm["ms"]["median"] + sr["ms"]["median"], (phases, v)
assert 0 < rh["fraction_of_step"] < 1 and 0 < nm["fraction_of_step"] < 1, v
assert len(r["params_xxh64"]) == 16, r["params_xxh64"]
# One loss and one learning rate per step, warm-up included; the token file's shape.
assert r["tokens_shape"] == [3, 2, 8, 128], r["tokens_shape"]
assert len(r["losses"]) == len(r["lrs"]) == 3 and r["losses"][-1] == r["last_loss"], r["losses"]
assert all(0 < lr <= 3e-4 * (1 + 2**-23) for lr in r["lrs"]), r["lrs"]
toks = open(sys.argv[2], "rb").read()
ids = [int.from_bytes(toks[i:i + 4], "little", signed=True) for i in range(0, len(toks), 4)]
assert all(0 <= t < 4096 for t in ids), "token outside the vocabulary"
# targets are the inputs shifted by one (a window of seq_len + 1 tokens)
step0_in, step0_tg = ids[0:1024], ids[1024:2048]
assert all(step0_in[b * 128 + t + 1] == step0_tg[b * 128 + t] for b in range(8) for t in range(127))
s = r["step_ms"]
assert s["min"] <= s["q1"] <= s["median"] <= s["q3"] <= s["max"], s
assert math.isfinite(r["last_loss"]) and r["last_loss"] > 0
PY

# Fast mode runs the GEMM [train] fast_gemm names, and the report says which.
for gemm in openblas lockstep; do
  "$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.steps=1 --bench.warmup=0 \
    --train.mode=fast --train.fast_gemm=$gemm --json fast_$gemm.json > fast_$gemm.log ||
    fail "fast bench with $gemm failed: $(cat fast_$gemm.log)"
done
/usr/bin/python3 - fast_openblas.json fast_lockstep.json <<'PY' || fail "bad fast-mode GEMM report"
import json, math, sys
o, l = (json.load(open(p)) for p in sys.argv[1:3])
assert o["fast_gemm"] == "OpenBLAS sgemm (" + o["openblas_core"] + ")", o["fast_gemm"]
assert l["fast_gemm"] == "Lockstep fast GEMM (" + l["isa"] + ")", l["fast_gemm"]
assert all(math.isfinite(r["last_loss"]) and r["last_loss"] > 0 for r in (o, l))
PY
grep -q "fast mode's GEMM Lockstep fast GEMM" fast_lockstep.log || fail "fast GEMM not named: $(cat fast_lockstep.log)"

# Bad options are one-line errors (exit 2).
expect_error "bench.steps: expected a non-negative integer" \
  "$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.steps=x
expect_error "bench.steps \\(0\\) must be >= 1" \
  "$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.steps=0
# Only bench may run without [data] train; training still requires a token file.
expect_error "\\[data\\] train: a token file is required" \
  "$LOCKSTEP" train --config "$SRC/scripts/configs/bench_small.toml"
# The precision recipe is benchmarked as configured and named in the report.
"$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.steps=1 --bench.warmup=0 \
  --train.precision=bf16 --json bf16.json > bf16.log || fail "bf16 bench failed: $(cat bf16.log)"
grep -q '^precision: bf16 (' bf16.log || fail "bf16 bench: no precision line: $(head -3 bf16.log)"
/usr/bin/python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["precision"].startswith("bf16 ("), "precision"' \
  bf16.json || fail "bf16 bench: no precision in the JSON"

# A run against a baseline in the same process: bf16 against fp32, steps alternating; each side
# named, the step-by-step ratio printed and in the JSON; the backend's and the batch's settings
# are the run's alone.
"$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.steps=2 --bench.warmup=1 --train.mode=fast \
  --train.precision=bf16 --bench.against=train.precision=fp32 --json pair.json > pair.log || fail "paired bench: $(cat pair.log)"
grep -q '^  this run: fast mode, bf16 (' pair.log && grep -q '^  baseline: fast mode, fp32$' pair.log ||
  fail "paired bench: the sides are not named: $(head -4 pair.log)"
grep -Eq '^this run is [0-9.]+x as fast as the baseline \(train.precision=fp32\): the median of 2 paired steps$' pair.log ||
  fail "paired bench: no ratio: $(tail -2 pair.log)"
/usr/bin/python3 - pair.json <<'PY' || fail "paired bench JSON: $(cat pair.json)"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["against"] == "train.precision=fp32" and r["steps"] == 2, r
for key in ("run_step_ms", "baseline_step_ms", "speedup"):
    assert 0 < r[key]["min"] <= r[key]["median"] <= r[key]["max"], (key, r[key])
PY
expect_error "--bench.against: train.threads is the run's" \
  "$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.against=train.mode=fast,train.threads=1
expect_error "--bench.against: expected KEY=VALUE\[,KEY=VALUE...\] with KEY a section.key .*got 'fp32'" \
  "$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.against=fp32
expect_error "\[train\] precision" \
  "$LOCKSTEP" bench --config "$SRC/scripts/configs/bench_small.toml" --bench.against=train.precision=fp16

echo "bench_smoke: ok"
