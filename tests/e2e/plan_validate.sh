#!/usr/bin/env bash
# The planner against this machine (`lockstep plan --cluster local --validate`) on tiny.toml's
# model: the collective benchmark's report (fp32 and exact all-reduce, all-gather, by size) and the passes'
# (every shape the search needs, timed on both ranks at once), each layout's collectives timed
# again before its run, four layouts run with `lockstep train` (data, tensor, pipeline and context
# parallel over the ring; the full campaign, e2e/slow/parallel_layouts.sh, adds context parallel by
# all-gather),
# their rows in the table and the JSON with a measured step and the fullest rank's peak memory
# (the runs' last metrics record), the memory prediction within 20% of it; bad input: --validate
# without the local cluster, a layout that does not fit (on one rank).
source "$(dirname "$0")/lib.sh"
make_data
write_config  # for the errors
data=(--data.train=data/train.bin --data.val=data/val.bin)
# A batch of four sequences: the passes of micro-batches of 1, 2 and 4 (eight would take as long as
# the others together).
want=("dp2 tp1 pp1 mb2 zero1" "dp1 tp2 pp1 mb4 zero0 sp" "dp1 tp1 pp2 mb2 zero0 1f1b" "dp1 tp1 pp1 cp2 p2p mb4 zero0")
full_campaign && want+=("dp1 tp1 pp1 cp2 mb4 zero0")
layouts=$(IFS=,; echo "${want[*]}")
n=${#want[@]}
"$LOCKSTEP" plan --model "$SRC/scripts/configs/tiny.toml" "${data[@]}" --cluster local --ranks 2 --precision fp32 --global-batch 4 \
  --validate --rounds 1 --steps 3 --layouts "$layouts" --out runs --json v.json > v.log 2>&1 \
  || fail "plan --validate: $(tail -5 v.log)"
grep -q '^plan: .*tiny.toml .* on local (2 GPUs, 1 x 2, .*canonical mode$' v.log || fail "no header: $(head -1 v.log)"
grep -Eq '^local: 2 ranks of one thread; GEMM peak [0-9.]+ GFLOP/s a rank; all-reduce ring fit alpha' v.log \
  || fail "no local cluster line: $(sed -n 2p v.log)"
grep -Eq "^validate: step time [0-9]+ of $n within 15%.*; peak memory [0-9]+ of $n within 15%" v.log \
  || fail "no validation summary: $(tail -3 v.log)"
python3 - runs/collectives.json runs/passes.json v.json runs "$layouts" <<'PY' || fail "validation reports: $(tail -8 v.log)"
import json, os, sys
c = json.load(open(sys.argv[1]))
series = ["all_reduce", "all_gather", "layer_gather", "exact_all_reduce", "exact_reduce_scatter", "exact_reduce_scatter_owned",
          "exact_fp32_reduce_scatter", "exact_fp32_reduce_scatter_owned"]
assert c["ranks"] == 2 and all(len(c[k]) == 7 for k in series), c
assert all(s["seconds"] > 0 for k in series for s in c[k]), c
assert c["bandwidth_gbs"] > 0, c
p = json.load(open(sys.argv[2]))
shapes = {(s["tp"], s["sp"], s["cp"], s["ring"], s["micro_batch"], s["recompute"]) for s in p["passes"]}
# tp 1, tp 2, tp 2 sp, cp 2 and cp 2 over the ring; micro-batches 1, 2, 4; three recomputations.
assert len(shapes) == 5 * 3 * 3 and (2, True, 1, False, 1, "full") in shapes, sorted(shapes)
assert (1, False, 2, False, 1, "full") in shapes and (1, False, 2, True, 1, "full") in shapes, sorted(shapes)
assert all(s["forward_s"] > 0 and s["backward_s"] > 0 for s in p["passes"]) and p["runtime_mib"] > 0, p
# The zero-bubble schedule's split backward, timed where it runs (no recomputation).
assert all((s["backward_input_s"] > 0 and s["backward_weight_s"] > 0) == (s["recompute"] == "none") for s in p["passes"]), p
# Each layout's collectives timed again before its run, up to the first size that holds the
# gradients (tiny.toml's 3.4 MB: 4 KiB to 4 MiB).
for name in [n for n in os.listdir(os.path.join(sys.argv[4], "collectives")) if n.endswith(".json")]:
    l = json.load(open(os.path.join(sys.argv[4], "collectives", name)))
    assert l["ranks"] == 2 and [s["bytes"] for s in l["all_reduce"]] == [4096 * 4**k for k in range(6)], (name, l)
v = json.load(open(sys.argv[3]))["validate"]
want = sys.argv[5].split(",")
assert [r["layout"] for r in v] == want, [r["layout"] for r in v]
for r in v:
    assert r["measured_step_s"] > 0 and r["predicted"]["step_s"] > 0, r
    assert abs(r["memory_error"]) < 0.2, (r["layout"], r["memory_error"])
    name = r["layout"].replace(" ", "_").replace("=", "-")
    assert os.path.exists(os.path.join(sys.argv[4], "collectives", name + ".json")), name
    run = os.path.join(sys.argv[4], name, "metrics.jsonl")
    last = json.loads(open(run).read().splitlines()[-1])
    assert len(last["peak_mem_mib_by_rank"]) == 2 and max(last["peak_mem_mib_by_rank"]) * 2**20 == r["measured_peak_bytes"], last
    print(f'{r["layout"]}: predicted {1e3 * r["predicted"]["step_s"]:.1f} ms, measured {1e3 * r["measured_step_s"]:.1f} ms; '
          f'memory error {100 * r["memory_error"]:.1f}%')
PY
[ "$(grep -c "^  round 1/1, [1-$n]/$n: " v.log)" -eq "$n" ] || fail "expected a progress line per run: $(grep round v.log)"

expect_error "--validate runs the layouts here: it needs --cluster local" \
  "$LOCKSTEP" plan --model cfg.toml --cluster "$SRC/scripts/clusters/a100_1024.toml" --validate
# One rank (no launcher, no collectives): the layouts of one process only.
expect_error "--layouts: dp2 tp1 pp1 mb4 zero0 is not a layout that fits here" \
  "$LOCKSTEP" plan --model "$SRC/scripts/configs/tiny.toml" "${data[@]}" --cluster local --ranks 1 --validate \
  --layouts "dp2 tp1 pp1 mb4 zero0" --out runs1
echo "plan validate: $(grep '^validate: step time' v.log)"
