#!/usr/bin/env bash
# The layout planner (`lockstep plan`, src/plan/): GPT-3 175B on the shipped 1,024-A100 cluster —
# a ranked table whose rows fit, are sorted and add up, Megatron-LM's published layout among the
# first five and within 20% of its published throughput, the rejections by reason, the same ranking
# in the JSON, the breakdowns as bars in the SVG, one layout explained; bad input, once each: a cluster field missing, an unknown
# precision, a precision the GPUs lack, a cluster that cannot hold the model (by how much); context
# parallelism for Llama 3 8B's shape on
# sequences of 32,768 (its column, its layouts among the first, one explained, its refusals named);
# a MoE model's busiest expert-parallel rank loaded by --moe-load.
source "$(dirname "$0")/lib.sh"
plan() { "$LOCKSTEP" plan --model "$SRC/scripts/configs/gpt3_175b.toml" --global-batch 1536 "$@"; }

plan --cluster "$SRC/scripts/clusters/a100_1024.toml" --top 5 --json plan.json --svg plan.svg > plan.log
grep -q '^plan: .*gpt3_175b.toml (174.62B parameters, 96 layers, d_model 12288) on a100_1024 (1024 GPUs, 128 x 8, 80 GiB): 1536 x 2048 tokens a step, bf16, fast mode$' plan.log \
  || fail "no plan header: $(head -1 plan.log)"
grep -Eq '^goodput: the job fails every [0-9.]+ min \(50000 GPU-hours each over 1024 GPUs\); a checkpoint of 1951\.[0-9] GiB takes [0-9.]+ s, every [0-9]+ steps .*% of the time trains' plan.log \
  || fail "no goodput: $(grep goodput plan.log)"
grep -Eq '^considered [0-9]+ layouts: [0-9]+ fit; .*memory [0-9]+ \(e\.g\. .*over the 80 GiB of HBM by' plan.log \
  || fail "no rejection summary: $(tail -1 plan.log)"
python3 - plan.log plan.json <<'PY' || fail "plan table: $(cat plan.log)"
import json, re, sys
rows = [l.split() for l in open(sys.argv[1]) if re.match(r"^[0-9]+ +dp", l)]
assert len(rows) == 5, rows
j = json.load(open(sys.argv[2]))
ranked = j["ranked"]
assert len(ranked) >= 5 and j["considered"] == sum(r["count"] for r in j["rejected"].values()) + len(ranked)
steps = [r["step_s"] for r in ranked]
assert steps == sorted(steps), "not ranked by step time"
for r in ranked:
    t, m = r["time_s"], r["memory_gib"]
    assert 0 < t["optimizer"] < 0.01 * r["step_s"], r  # its bytes at the HBM's streaming rate
    assert 0 < t["streaming"] < t["compute"], r  # the kernels other than GEMMs, part of compute
    assert t["ep_comm"] == 0, r  # a dense model
    assert (t["cp_comm"] > 0) == (" cp" in r["layout"]), r
    assert t["skew"] == 0, r  # a declared cluster's GPUs run in step
    assert 0 < t["state_at_rest"] < 0.01 * r["step_s"], r  # two hashes of the parameters and moments a GPU holds
    parts = (t["compute"] + t["tp_comm"] + t["cp_comm"] + t["pipeline"] + t["dp_exposed"] + t["skew"] + t["optimizer"]
             + t["state_at_rest"])
    assert abs(parts - r["step_s"]) < 1e-9 * r["step_s"], r
    assert m["total"] <= 80 and abs(sum(v for k, v in m.items() if k != "total") - m["total"]) < 1e-9, r
    assert 0 < r["mfu"] < 0.8, r  # below the declared GEMM efficiency
    assert abs(r["tokens_per_s"] * r["step_s"] - 1536 * 2048) < 1e-6 * 1536 * 2048, r
for row, r in zip(rows, ranked):
    assert " ".join(row[1:-11]) == r["layout"], (row, r["layout"])
print("best:", ranked[0]["layout"], round(ranked[0]["step_s"], 3), "s, MFU", round(ranked[0]["mfu"], 3))
# The anchor: Megatron-LM's SC'21 layout for this model and batch (tp 8, pp 8, dp 16) among the
# first five, and as it ran (full recomputation, 1F1B) within 20% of its 45% of peak, which counts
# the recomputed forward: the HFU. It is at +19.8% (docs/planner.md): a change to the cost model that
# moves it past the issue's 20% fails here.
rank = next(i for i, r in enumerate(ranked) if r["layout"].startswith("dp16 tp8 pp8 "))
assert rank < 5, (rank, [r["layout"] for r in ranked[:5]])
as_run = next(r for r in ranked if r["layout"] == "dp16 tp8 pp8 mb1 zero0 1f1b recompute=full")
assert abs(as_run["hfu"] / 0.45 - 1) < 0.2, as_run
print("SC'21: dp16 tp8 pp8 ranks", rank + 1, "; as run, HFU", round(as_run["hfu"], 3), "against 0.45")
PY
best=$(python3 -c "import json; print(json.load(open('plan.json'))['ranked'][0]['layout'])")
for what in "predicted step time" "memory of the fullest GPU" "1. $best" "context-parallel gathers" "data-parallel exposed" "activations"; do
  grep -q "$what" plan.svg || fail "plan.svg lacks '$what'"
done
[ "$(grep -c '^<rect x=.*<title>' plan.svg)" -eq 65 ] || fail "plan.svg: expected 5 x (8 + 5) bars, got $(grep -c '^<rect x=.*<title>' plan.svg)"
plan --cluster "$SRC/scripts/clusters/a100_1024.toml" --explain "$best" > explain.log
grep -Eq "^layout $best: [0-9]+ micro-batches a step per pipeline" explain.log || fail "explain: $(cat explain.log)"
grep -Eq "of which recomputation [0-9.]+ s, and kernels other than GEMMs [0-9.]*[1-9][0-9]* s, recomputed ones included;.* \+ optimizer [0-9.]+ s \+ state-at-rest hashes [0-9.]+ s$" explain.log ||
  fail "explain: no streaming kernels, optimizer or state-at-rest hashes: $(cat explain.log)"
grep -Eq '^memory of the fullest GPU [0-9.]+ GiB of 80 GiB: parameters' explain.log || fail "explain memory: $(cat explain.log)"

sed '/^latency_us = 10/d' "$SRC/scripts/clusters/a100_1024.toml" > no_latency.toml
expect_error "no_latency.toml: \[inter_node\] latency_us is missing" plan --cluster no_latency.toml
expect_error "--precision: expected fp32, bf16 or fp8, got 'fp16'" plan --cluster "$SRC/scripts/clusters/a100_1024.toml" --precision fp16
expect_error "no layout of .*gpt3_175b.toml runs on a100_1024: precision [0-9]+ \(e\.g\. .*: the cluster's GPUs have no fp8 units" \
  plan --cluster "$SRC/scripts/clusters/a100_1024.toml" --precision fp8
sed -e 's/^nodes = .*/nodes = 1/' -e 's/^hbm_gib = .*/hbm_gib = 16/' -e 's/^reserved_gib = .*/reserved_gib = 1/' \
  "$SRC/scripts/clusters/a100_1024.toml" > small.toml
expect_error "no layout of .*gpt3_175b.toml fits a100_1024: the one that needs least memory \(dp[0-9]+ tp[0-9]+ pp[0-9]+ .*\) needs [0-9.]+ GiB a GPU, [0-9.]+ GiB over its 16 GiB" \
  plan --cluster small.toml
# Context parallelism: Llama 3 8B's shape on 32 H100s with sequences of 32,768, where a sequence's
# attention probabilities outweigh its weights. Layouts that cut the sequences into cp blocks rank
# among the first five, their gathers and reductions in the "cp s" column; the trainer's refusal of
# cp with pipelining is counted by its reason.
llama8b=(--model "$SRC/scripts/configs/llama3_405b.toml" --model.d_model=4096 --model.n_layers=32 --model.n_heads=32
  --model.n_kv_heads=8 --model.ffn_hidden=14336 --cluster "$SRC/scripts/clusters/h100_16384.toml" --nodes 4
  --seq-len 32768 --global-batch 32)
"$LOCKSTEP" plan "${llama8b[@]}" --top 5 --json long.json > long.log || fail "long sequences: $(tail -3 long.log)"
grep -Eq '^rank +layout +step s +tokens/s +MFU +compute s +tp s +cp s +ep s ' long.log || fail "no cp column: $(sed -n 2p long.log)"
grep -Eq '; cp [0-9]+ \(e\.g\. [^)]* cp[0-9]+ .*does not run with pipeline parallelism' long.log \
  || fail "no cp rejection: $(tail -1 long.log)"
cp_best=$(python3 - long.log long.json <<'PY'
import json, re, sys
rows = [l.split() for l in open(sys.argv[1]) if re.match(r"^[0-9]+ +dp", l)]
ranked = json.load(open(sys.argv[2]))["ranked"][:5]
cp = [(row, r) for row, r in zip(rows, ranked) if re.search(r" cp[0-9]+ ", r["layout"])]
assert cp, [r["layout"] for r in ranked]
for row, r in cp:
    assert r["time_s"]["cp_comm"] > 0 and row[-6] == f'{r["time_s"]["cp_comm"]:.3f}', (row, r)
print(cp[0][1]["layout"])
PY
) || fail "no cp layout among the first five: $(head -8 long.log)"
"$LOCKSTEP" plan "${llama8b[@]}" --explain "$cp_best" > long_explain.log
grep -Eq "context-parallel gathers and reductions 0\.[0-9]*[1-9][0-9]* s" long_explain.log || fail "explain cp: $(cat long_explain.log)"
expect_error "cp = 2 does not run with pipeline parallelism" "$LOCKSTEP" plan "${llama8b[@]}" --explain "dp8 tp1 pp2 cp2 mb1 zero0 1f1b"
# An unbalanced router (--moe-load): an expert-parallel layout of a MoE model takes longer, in its
# compute and its exchanges, when its busiest rank gets 1.5 times its share of the routed rows; a
# layout without ep does not change; a dense model, or a load below 1, is an error.
moe=(--model "$SRC/scripts/configs/tiny_moe.toml" --cluster "$SRC/scripts/clusters/a100_1024.toml" --nodes 1)
"$LOCKSTEP" plan "${moe[@]}" --json moe_even.json > moe_even.log || fail "moe plan: $(tail -3 moe_even.log)"
"$LOCKSTEP" plan "${moe[@]}" --moe-load 1.5 --json moe_load.json > moe_load.log || fail "moe plan: $(tail -3 moe_load.log)"
grep -q '^plan: .*, the busiest expert-parallel rank routed 1.50 times its share$' moe_load.log ||
  fail "moe load not in the header: $(head -1 moe_load.log)"
python3 - moe_even.json moe_load.json <<'PY' || fail "moe load"
import json, sys
even, load = ({r["layout"]: r for r in json.load(open(f))["ranked"]} for f in sys.argv[1:])
ep = [l for l in even if " ep" in l]
assert ep, "no ep layout"
for l in ep:
    assert load[l]["time_s"]["compute"] > even[l]["time_s"]["compute"], l
    assert load[l]["time_s"]["ep_comm"] > even[l]["time_s"]["ep_comm"], l
for l in even:
    if " ep" not in l:
        assert load[l]["step_s"] == even[l]["step_s"], l
PY
expect_error "--moe-load: .*gpt3_175b.toml has no mixture-of-experts layers" \
  plan --cluster "$SRC/scripts/clusters/a100_1024.toml" --moe-load 1.2
expect_error "--moe-load: expected a number >= 1 .* got '0.5'" "$LOCKSTEP" plan "${moe[@]}" --moe-load 0.5
echo "plan: $(head -3 plan.log | tail -1); 32k sequences: the best cp layout $cp_best"
