#!/usr/bin/env bash
# Fast mode under every parallel layout stays within the derived bounds of the single-process fast
# run: dp2 (zero 2), dp4 (zero 1), tp2 with sequence parallelism, tp4, dp2 x tp2 (zero 0 with
# sequence parallelism; zero 2 with the fp32 MPI gradient reduction) dump every tensor of 2 steps
# as global tensors, and `lockstep diff --bounds` against the single process finds each side's
# every tensor within its op-local bound (verify/op_bounds.hpp), while most of them differ bitwise.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
# Fast mode has no chunk alignment to keep: the smallest model whose heads (4) and vocabulary
# (260 >= the byte tokenizer's 257) split over 4 ranks.
sed -i -e 's/^vocab_size = .*/vocab_size = 260/' cfg.toml
args=(--config cfg.toml --train.steps=2 --train.threads=1 --train.mode=fast --parallel.timeout_s=60
      --checkpoint.every=1)
"$LOCKSTEP" train "${args[@]}" --checkpoint.dir=ck_single --dump.dir=single > single.log
check() {  # check NP NAME [overrides...]
  local np=$1 name=$2
  shift 2
  mpirun --oversubscribe -np "$np" "$LOCKSTEP" train "${args[@]}" --checkpoint.dir="ck_$name" --dump.dir="$name" "$@" \
    > "$name.log" 2>&1 || fail "$name failed: $(tail -5 "$name.log")"
  "$LOCKSTEP" diff single "$name" --bounds --ckpt-a=ck_single --ckpt-b="ck_$name" --json "$name.json" > "$name.txt" ||
    fail "$name outside its op-local bounds: $(head -1 "$name.txt"); $(awk '$3 != 0' "$name.txt" | head -4)"
  /usr/bin/python3 - "$name.json" single/manifest.json <<'PY' || fail "$name: JSON check failed: $(head -1 "$name.txt")"
import json, sys
r, single = (json.load(open(p)) for p in sys.argv[1:3])
assert r["agree"] and not r["only_in_a"] and not r["only_in_b"]
rows = r["tensors"]
assert len(rows) == len(single["tensors"]) and all("bounds" in t for t in rows)
# The layout really computes differently (float reductions split across ranks) ...
assert sum(not t["bitwise_equal"] for t in rows) > len(rows) // 2, sum(not t["bitwise_equal"] for t in rows)
# ... and within bounds that are not vacuous.
assert max(t["bounds"]["tightness_b"] for t in rows) > 1e-3
PY
}
check 2 dp2_z2 --parallel.dp=2 --parallel.zero=2
check 4 dp4_z1 --parallel.dp=4 --parallel.zero=1
check 2 tp2_sp --parallel.tp=2 --parallel.sp=true
check 4 tp4 --parallel.tp=4
check 4 dp2tp2_z0_sp --parallel.dp=2 --parallel.tp=2 --parallel.zero=0 --parallel.sp=true
check 4 dp2tp2_z2 --parallel.dp=2 --parallel.tp=2 --parallel.zero=2 --parallel.reduce=fast
echo "dump_layouts_fast: dp2, dp4, tp2 sp, tp4, dp2 x tp2 (zero 0/1/2) fast runs within the single process's op-local bounds"
