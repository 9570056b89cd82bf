#!/usr/bin/env bash
# The fp8 sentinel (verify/detect/fp8_sentinel.hpp) on planted instabilities ([inject] outlier,
# spread, fp8_scale; src/train/inject.hpp):
#  - a clean 40-step run with a shadow check every 5 steps raises no fp8 finding, writes its checks
#    and statistics to the metrics JSONL, and the sentinel changes no bit of the model;
#  - a feature channel of layer 1's fc input that grows 1.5x a step from step 20 is found at
#    fp8/layer/1/mlp/fc/input (its quantization error passes what rounding may cost) within 8 steps
#    (a statistic is reported once it has lasted [verify] fp8_patience = 3 steps);
#  - one gradient element 2^40 times too large in step 30 is found at fp8/layer/1/mlp/fc/grad_output
#    after step 34: delayed scaling keeps its amax, and the gradients after it underflow;
#  - a delayed scale 2^6 too large is found by the shadow check of that linear's fprop GEMM in its
#    step, and from step 30 on at fp8/layer/0/mlp/fc/input, saturated, after step 33;
#  - on_fp8 = "stop" ends the run with exit 7 at the first finding;
#  - `lockstep fp8 report` ranks the GEMMs, names the findings and draws the SVG;
#  - bad input: an fp8/ site of a tensor that does not exist, an outlier without growth.
source "$(dirname "$0")/lib.sh"
make_data
write_tp_config 384 128
sed -i 's/^mode = .*/mode = "canonical"\nprecision = "fp8"/' cfg.toml
run() { "$LOCKSTEP" train --config cfg.toml --train.threads=2 --log.every=100 "$@"; }
fp8_findings() { grep '^finding: .*detector fp8' "$1" || true; }

run --train.steps=40 --verify.fp8_sentinel_every=0 > quiet.log
run --train.steps=40 --verify.fp8_sentinel_every=5 --log.metrics=clean.jsonl > clean.log
[ -z "$(fp8_findings clean.log)" ] || fail "clean run: $(fp8_findings clean.log)"
[ "$(model_hash clean.log)" = "$(model_hash quiet.log)" ] || fail "the sentinel changed the model"
grep -q '^fp8 sentinel: step 40, quantization error relative to the bf16 product, largest first: layer/' clean.log \
  || fail "no ranking line: $(grep 'fp8 sentinel' clean.log | tail -1)"
python3 - clean.jsonl <<'PY' || fail "sentinel records: $(grep fp8_sentinel clean.jsonl | head -1)"
import json, sys
checks = [json.loads(l)["fp8_sentinel"] for l in open(sys.argv[1]) if '"fp8_sentinel"' in l]
assert len(checks) == 8, len(checks)
gemms = checks[-1]
assert "layer/0/mlp/fc/fprop" in gemms and "layer/1/attn/qkv/wgrad" in gemms, sorted(gemms)
assert all(0 < g["ratio"] < 1 and g["rel_error"] > 0 for g in gemms.values()), gemms
PY

# An outlier channel that grows: the amax history lags it, the channel saturates.
run --train.steps=40 --inject.site=layer/1/ln2/out --inject.kind=outlier:channel=5,growth=1.5 --inject.step=20 \
  --log.metrics=outlier.jsonl > outlier.log
first=$(fp8_findings outlier.log | head -1)
echo "$first" | grep -Eq '^finding: after step 2[1-8], detector fp8, site fp8/layer/1/mlp/fc/input, .*\(fp8 quantization error\)' \
  || fail "outlier: first fp8 finding '$first'"
# A gradient whose range outgrows e5m2's, once: delayed scaling keeps its amax in the history, and
# the gradients after it underflow.
run --train.steps=36 --inject.site=grad/layer/1/mlp/fc --inject.kind=spread:power=40 --inject.step=30 > spread.log
fp8_findings spread.log | head -1 | grep -q '^finding: after step 34, detector fp8, site fp8/layer/1/mlp/fc/grad_output, .*(fp8 underflow)' \
  || fail "spread: $(fp8_findings spread.log | head -2)"
# A delayed scale off by 2^6: the shadow check of the GEMM in its step, saturation after three.
run --train.steps=34 --verify.fp8_sentinel_every=1 --inject.site=fp8/layer/0/mlp/fc/input \
  --inject.kind=fp8_scale:power=6 --inject.step=30 --inject.persistent=true > scale.log
for want in "31, detector fp8, site fp8/layer/0/mlp/fc/fprop, .*(fp8 quantization error)" \
            "33, detector fp8, site fp8/layer/0/mlp/fc/input, .*(fp8 quantization error)" \
            "33, detector fp8, site fp8/layer/0/mlp/fc/input, .*(fp8 saturated)"; do
  fp8_findings scale.log | grep -Eq "^finding: after step $want" || fail "fp8_scale: no finding $want: $(fp8_findings scale.log)"
done
[ "$(fp8_findings scale.log | grep -c 'fp8/layer/1')" -eq 0 ] || fail "fp8_scale: findings at other layers"
status=0
run --train.steps=34 --verify.on_fp8=stop --inject.site=fp8/layer/0/mlp/fc/input --inject.kind=fp8_scale:power=6 \
  --inject.step=30 --inject.persistent=true > stop.log 2>&1 || status=$?
[ "$status" -eq 7 ] || fail "on_fp8 = stop: exit $status: $(tail -2 stop.log)"

"$LOCKSTEP" fp8 report outlier.jsonl --out outlier.svg --top 4 > report.log || fail "fp8 report: $(cat report.log)"
grep -q '^fp8 report: 40 steps of per-tensor statistics, 2 shadow checks, [1-9][0-9]* findings' report.log \
  || fail "fp8 report header: $(head -1 report.log)"
grep -Eq '^  layer/1/mlp/fc/input +error_ratio [0-9.]+ \(step' report.log || fail "fp8 report tensors: $(cat report.log)"
grep -q '^finding after step 2[1-8]: fp8/layer/1/mlp/fc/input fp8 quantization error' report.log \
  || fail "fp8 report findings: $(grep '^finding' report.log)"
[ "$(grep -c '<svg' outlier.svg)" -eq 5 ] || fail "fp8 report: expected 4 plots in one SVG"

expect_error "\[inject\] site \"fp8/layer/0/mlp/fc/bias\" is not a tensor with a delayed fp8 scale" \
  run --train.steps=2 --inject.site=fp8/layer/0/mlp/fc/bias --inject.kind=fp8_scale:power=2 --inject.step=0
expect_error "\[inject\] kind outlier: channel=C .* and growth=G > 0" \
  run --train.steps=2 --inject.site=layer/1/ln2/out --inject.kind=outlier:channel=5 --inject.step=0
echo "fp8_sentinel: outlier $(echo "$first" | cut -d, -f1), spread and fp8_scale found at their tensors; clean run quiet"
