#!/usr/bin/env bash
# [verify] abft end to end from the CLI — the GEMM checksums of every linear layer's products:
#  - with the checks on, a clean run has no finding and the same model hash as without them
#    (canonical and fast: the checks only read the products), and says how many it checked;
#  - a bit flipped in a product as the op leaves it ([inject] gemm/WEIGHT/PRODUCT, a faulty
#    multiply) is found in the step it happens, naming the product and the element (exit 6); with
#    on_fault = "warn" the run goes on to its end;
#  - the same under dp2 x tp2 (fast mode) with the fault on rank 1 only: the finding names rank 1;
#  - the last bit of a product flipped is below the threshold: no finding (a benign fault);
#  - bad sites and kinds are one clear error each;
#  - `lockstep bench --verify.abft=true` reports the checks' cost and tightness.
source "$(dirname "$0")/lib.sh"
make_data
write_config
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { "$LOCKSTEP" train --config cfg.toml --train.steps=8 "$@"; }

for mode in canonical fast; do
  run --train.mode=$mode > plain_$mode.log 2>&1 || fail "plain $mode run: $(tail -3 plain_$mode.log)"
  run --train.mode=$mode --verify.abft=true > abft_$mode.log 2>&1 || fail "abft $mode run: $(tail -3 abft_$mode.log)"
  grep -q '^finding' abft_$mode.log && fail "a clean $mode run reported: $(grep '^finding' abft_$mode.log)"
  [ "$(model_hash plain_$mode.log)" = "$(model_hash abft_$mode.log)" ] \
    || fail "$mode: the checks changed the model ($(model_hash plain_$mode.log) vs $(model_hash abft_$mode.log))"
  grep -Eq '^abft: [1-9][0-9]* products checked on rank 0, 0 failed' abft_$mode.log \
    || fail "$mode: no summary of the checks: $(tail -2 abft_$mode.log)"

  status=0
  run --train.mode=$mode --verify.abft=true --inject.site=gemm/layer/1/mlp/fc/weight/forward --inject.step=3 \
    --inject.kind=bitflip:bit=27,index=300 > fwd_$mode.log 2>&1 || status=$?
  [ "$status" -eq 6 ] || fail "$mode forward fault: expected exit 6, got $status: $(tail -3 fwd_$mode.log)"
  grep -Eq '^finding: after step 4, detector abft, site gemm/layer/1/mlp/fc/weight/forward, ranks 0: .*the row checksum of token 1 fails, at output feature 44 ' \
    fwd_$mode.log || fail "$mode: no finding naming the product and element: $(grep -E '^(finding|stopped)' fwd_$mode.log)"
  grep -q '^stopped after step 4 on the abft finding' fwd_$mode.log || fail "$mode: no stop line"

  run --train.mode=$mode --verify.abft=true --verify.on_fault=warn --inject.site=gemm/wte/dweight --inject.step=2 \
    --inject.kind=bitflip:bit=29,index=1000 > dw_$mode.log 2>&1 || fail "$mode warn run: $(tail -3 dw_$mode.log)"
  grep -Eq '^finding: after step 3, detector abft, site gemm/wte/dweight, ranks 0: .*output feature 15 fails' dw_$mode.log \
    || fail "$mode: no weight-gradient finding: $(grep '^finding' dw_$mode.log)"
  grep -q '^done: 8 steps' dw_$mode.log || fail "$mode: the warned run did not finish"

  run --train.mode=$mode --verify.abft=true --inject.site=gemm/layer/0/attn/qkv/weight/dinp --inject.step=3 \
    --inject.kind=bitflip:bit=0,index=5 > lastbit_$mode.log 2>&1 || fail "$mode last bit: $(tail -3 lastbit_$mode.log)"
  grep -q '^finding' lastbit_$mode.log && fail "$mode: a last-bit flip was found: $(grep '^finding' lastbit_$mode.log)"
done

mpi() {
  mpirun --oversubscribe -np 4 "$LOCKSTEP" train --config cfg.toml --train.steps=6 --train.threads=1 \
    --train.mode=fast --model.vocab_size=384 --parallel.dp=2 --parallel.tp=2 --verify.abft=true "$@"
}
status=0
mpi --inject.site=gemm/layer/0/mlp/proj/weight/dweight --inject.step=2 --inject.rank=1 \
  --inject.kind=bitflip:bit=28,index=70 > mpi.log 2>&1 || status=$?
[ "$status" -eq 6 ] || fail "dp2 x tp2: expected exit 6, got $status: $(tail -5 mpi.log)"
[ "$(grep -c '^finding:' mpi.log)" -eq 1 ] || fail "dp2 x tp2: expected one finding line: $(grep '^finding' mpi.log)"
grep -Eq '^finding: after step 3, detector abft, site gemm/layer/0/mlp/proj/weight/dweight, ranks 1:' mpi.log \
  || fail "dp2 x tp2: the finding does not name rank 1: $(grep '^finding' mpi.log)"

expect_error 'gemm/layer/0/mlp/nothing/weight/forward: expected gemm/WEIGHT/forward\|dinp\|dweight' \
  run --inject.site=gemm/layer/0/mlp/nothing/weight/forward --inject.kind=bitflip:bit=1
expect_error 'gemm/layer/0/mlp/fc/weight/sideways: expected gemm/WEIGHT' \
  run --inject.site=gemm/layer/0/mlp/fc/weight/sideways --inject.kind=bitflip:bit=1
expect_error 'site gemm/wte/forward \(a GEMM product\) takes kind bitflip' \
  run --inject.site=gemm/wte/forward --inject.kind=cast:bf16
expect_error '--verify.abft: expected true or false' run --verify.abft=sometimes

cat > bench.toml <<'TOML'
[model]
vocab_size = 256
seq_len = 64
d_model = 64
n_layers = 2
n_heads = 4

[train]
batch_size = 2
mode = "fast"
threads = 1
peak_gflops = 100
TOML
"$LOCKSTEP" bench --config bench.toml --bench.steps=2 --bench.warmup=1 --verify.abft=true --json bench.json \
  > bench.log 2>&1 || fail "bench: $(tail -3 bench.log)"
grep -Eq '^abft \(\[verify\] abft, inside the step\): 27 products checked per step in [0-9.]+ ms = [0-9.]+% of the step without them; .* 0 failed' bench.log \
  || fail "bench: no abft line: $(grep abft bench.log)"
python3 - <<'EOF' || fail "bench JSON: no abft entry"
import json
a = json.load(open("bench.json"))["verification"]["abft"]
assert a["products_per_step"] == 27 and a["failed"] == 0 and 0 < a["tightness"] < 1 and a["fraction_of_step"] > 0, a
EOF
echo "abft: clean runs unchanged, faults found and named, benign flips quiet, errors clear, bench reports"
