#!/usr/bin/env bash
# The planner's published anchors on the largest clusters, minutes each on two cores (the label
# `slow`, registered with -DLS_SLOW_TESTS=ON; tests/e2e/plan.sh holds GPT-3 175B's anchor in the
# default suite): Llama 3 405B on 16,384 H100s among the first ten, Megatron-LM's 530B and 1T runs
# among the first five, and the 530B run of Korthikanti et al. within 20% of its published MFU.
source "$(dirname "$0")/../lib.sh"
# An anchor: Llama 3 405B's published layout on 16,384 H100s (tp 8, pp 16, dp 128; the Llama 3
# paper, Table 4) fits and ranks among the planner's first ten (docs/planner.md says why not first).
"$LOCKSTEP" plan --model "$SRC/scripts/configs/llama3_405b.toml" --cluster "$SRC/scripts/clusters/h100_16384.toml" \
  --global-batch 2048 --json llama.json > llama.log
python3 - llama.json <<'PY' || fail "llama 3 anchor: $(head -12 llama.log)"
import json, sys
ranked = [r["layout"] for r in json.load(open(sys.argv[1]))["ranked"]]
rank = next(i for i, l in enumerate(ranked) if l.startswith("dp128 tp8 pp16 "))
assert rank < 10, (rank, ranked[:10])
print("llama 3 405B: the published dp128 tp8 pp16 ranks", rank + 1, "of", len(ranked), "as", ranked[rank])
PY
# Megatron-LM's SC'21 anchors (Table 1): the 530B model on 2,520 A100s as tp 8 x pp 35 (dp 9) and
# the 1T model on 3,072 as tp 8 x pp 64 (dp 6), both at 52% of peak: among the first five. That
# 52% counts the recomputed forward (the paper's FLOP formula is four passes), so the layout as it
# ran there — full recomputation, no sequence parallelism — is set beside it by its HFU, printed:
# the planner prices the 2021 runs 10-20% above what they reached (docs/planner.md).
for anchor in "gpt_530b 315 dp9 tp8 pp35 " "gpt_1t 384 dp6 tp8 pp64 "; do
  set -- $anchor
  "$LOCKSTEP" plan --model "$SRC/scripts/configs/$1.toml" --cluster "$SRC/scripts/clusters/a100_1024.toml" --nodes "$2" \
    --json "$1.json" > "$1.log" || fail "$1: $(tail -3 "$1.log")"
  python3 - "$1.json" "$3 $4 $5 " <<'PY' || fail "$1 anchor: $(head -8 "$1.log")"
import json, sys
ranked = json.load(open(sys.argv[1]))["ranked"]
rank = next(i for i, r in enumerate(ranked) if r["layout"].startswith(sys.argv[2]))
assert rank < 5, (rank, [r["layout"] for r in ranked[:5]])
as_run = next(r for r in ranked if r["layout"] == sys.argv[2] + "mb1 zero0 1f1b recompute=full")
print(sys.argv[1][:-5], "the published", sys.argv[2].strip(), "ranks", rank + 1, "of", len(ranked), "; as run there, HFU",
      round(as_run["hfu"], 3), "against 0.522")
PY
done
# Korthikanti et al. (MLSys'23): the 530B model on 2,240 A100s as tp 8 x pp 35 (dp 8) at 54.2% MFU
# with sequence parallelism and selective recomputation, 42.1% with full recomputation: the
# planner's MFU for each within 20% (a batch of 1920 sequences, one a micro-batch).
"$LOCKSTEP" plan --model "$SRC/scripts/configs/gpt_530b.toml" --cluster "$SRC/scripts/clusters/a100_1024.toml" \
  --nodes 280 --global-batch 1920 --json k.json > k.log || fail "530B on 2,240 GPUs: $(tail -3 k.log)"
python3 - k.json <<'PY' || fail "530B on 2,240 GPUs: $(head -8 k.log)"
import json, sys
ranked = {r["layout"]: r for r in json.load(open(sys.argv[1]))["ranked"]}
for variant, published in (("sp 1f1b recompute=selective", 0.542), ("1f1b recompute=full", 0.421)):
    r = ranked["dp8 tp8 pp35 mb1 zero0 " + variant]
    assert abs(r["mfu"] / published - 1) < 0.2, (r["layout"], r["mfu"], published)
    print("530B on 2,240 GPUs,", r["layout"], ": MFU", round(r["mfu"], 3), "against", published)
PY
echo "plan anchors: OK"
