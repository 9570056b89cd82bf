#!/usr/bin/env bash
# Dumps of tensor-, sequence- and data-parallel runs hold global tensors (canonical mode):
#  - dp2 x tp2 (zero 1), tp2 with sequence parallelism, tp4 and dp2 (zero 2) dump every tensor of 2
#    steps with the names, shapes and order of the single-process dump, and `lockstep diff` finds
#    every one of them bitwise equal to it;
#  - a bit flipped on tp rank 1 only lands where that rank's shard lies in the global tensor: in the
#    k features of QKV (tp2) and in the second half of the micro-batch's tokens of the residual
#    stream (tp2 with sequence parallelism); diff names the tensor and the global element.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
# d_model 256 and a vocabulary of 512 keep every split reduction on 64-element chunks up to tp4
# (canonical mode's condition for tensor parallelism).
sed -i -e 's/^vocab_size = .*/vocab_size = 512/' -e 's/^d_model = .*/d_model = 256/' cfg.toml
train() { "$LOCKSTEP" train --config cfg.toml --train.steps=2 --train.threads=1 --parallel.timeout_s=60 "$@"; }
mpi() {  # mpi NP NAME [overrides...]: a dump of every tensor of both steps in NAME
  local np=$1 name=$2
  shift 2
  mpirun --oversubscribe -np "$np" "$LOCKSTEP" train --config cfg.toml --train.steps=2 --train.threads=1 \
    --parallel.timeout_s=60 --dump.dir="$name" "$@" > "$name.log" 2>&1 || fail "$name failed: $(tail -5 "$name.log")"
}

train --dump.dir=single > single.log
mpi 4 dp2tp2 --parallel.dp=2 --parallel.tp=2 --parallel.zero=1
mpi 2 tp2sp --parallel.tp=2 --parallel.sp=true
mpi 4 tp4 --parallel.tp=4
mpi 2 dp2z2 --parallel.dp=2 --parallel.zero=2
for run in dp2tp2 tp2sp tp4 dp2z2; do
  "$LOCKSTEP" diff single "$run" --json "$run.json" > "$run.txt" || fail "single vs $run: $(head -1 "$run.txt"); $(grep ' diff ' "$run.txt" | head -3)"
  /usr/bin/python3 - single/manifest.json "$run/manifest.json" "$run.json" <<'PY' || fail "single vs $run: JSON check failed"
import json, sys
single, run, report = (json.load(open(p)) for p in sys.argv[1:4])
# The same tensors in the same order and shapes, every one bitwise equal.
assert [(t["name"], t["shape"]) for t in run["tensors"]] == [(t["name"], t["shape"]) for t in single["tensors"]]
assert report["agree"] and not report["only_in_a"] and not report["only_in_b"], report.get("first_divergent")
assert len(report["tensors"]) == len(single["tensors"]) and all(t["bitwise_equal"] for t in report["tensors"])
# Every kind of hook tensor is there (sharded by heads, features, vocabulary; whole; parameters).
names = {t["name"] for t in single["tensors"]}
for n in ["layer/1/attn/att", "grad/layer/0/attn/qkv", "layer/0/mlp/fc", "grad/logits", "grad/lnf/out",
          "layer/1/mlp/res", "losses", "loss", "grad/param/wte", "param/layer/1/attn/proj/weight"]:
    assert f"step/1/{n}" in names, n
PY
done

# One bit flipped by tp rank 1 (world rank 1) in step 1's first micro-batch, at local element I of
# its shard; diff must name the tensor and the element's global index.
flipped() {  # flipped NAME SITE INDEX WANT_FLAT_INDEX [overrides...]
  local name=$1 site=$2 index=$3 want=$4
  shift 4
  mpi 2 "$name" --parallel.tp=2 --inject.site="$site" --inject.step=1 --inject.rank=1 \
    --inject.kind=bitflip:bit=20,index="$index" "$@"
  local status=0
  "$LOCKSTEP" diff single "$name" --json "$name.json" > "$name.txt" || status=$?
  [ "$status" -eq 1 ] || fail "$name: expected exit 1 (diverged), got $status: $(head -1 "$name.txt")"
  /usr/bin/python3 - "$name.json" "step/1/$site" "$want" <<'PY' || fail "$name: $(head -1 "$name.txt")"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["first_divergent"] == sys.argv[2], r["first_divergent"]
first = next(t for t in r["tensors"] if t["name"] == sys.argv[2])
assert first["mismatches"] == 1 and first["first_mismatch"]["flat_index"] == int(sys.argv[3]), first
PY
}
# QKV's local features on tp rank 1 are [q 128..255 | k 384..511 | v 640..767] of [q | k | v]
# (256 each): local feature 130 of token 0 is global feature 386.
flipped qkv_tp2 layer/0/attn/qkv 130 386
# Under sequence parallelism rank 1 holds tokens 128..255 of the first micro-batch (4 sequences of
# 64): its residual element 0 is token 0 of sequence 2, global element 2 * 64 * 256.
flipped res_tp2sp layer/1/attn/res 0 32768 --parallel.sp=true
echo "dump_layouts: dp2 x tp2, tp2 sp, tp4, dp2 zero 2 dumps bitwise equal to the single process's; flips on tp rank 1 placed and named"
