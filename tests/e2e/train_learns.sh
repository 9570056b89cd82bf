#!/usr/bin/env bash
# Training learns the source: after a short run the validation loss is below what any model
# without context can reach. For a stationary source, H(X1) >= H(X1, ..., Xk) / k (subadditivity),
# so context_entropy_nats / order (from source.json) is a lower bound on every context-free loss;
# beating it proves the model uses its context. An order-1 source keeps the run short: its context
# is the current token, which needs no attention to be learned (order 2 needs an attention head to
# form first, a much longer plateau). Metrics JSONL and checkpoints are written too.
source "$(dirname "$0")/lib.sh"
"$LOCKSTEP" data synth --out data --order 1 --alphabet 8 --branch 2 --tokens 200000 --seed 7 >/dev/null
"$LOCKSTEP" data build --input data/corpus.txt --out data >/dev/null
write_config
"$LOCKSTEP" train --config cfg.toml --train.steps=120 --train.lr=3e-3 --train.warmup=10 \
  --eval.batches=8 --log.metrics=metrics.jsonl --checkpoint.dir=ck > run.log
val=$(grep -o 'val loss [0-9.]*' run.log | tail -1 | awk '{print $3}')
[ -n "$val" ] || fail "no val loss in run.log"
python3 - "$val" data/source.json metrics.jsonl <<'PY'
import json, sys
val = float(sys.argv[1])
src = json.load(open(sys.argv[2]))
bound = src["context_entropy_nats"] / src["order"]
rows = [json.loads(l) for l in open(sys.argv[3])]
steps = [r for r in rows if "loss" in r]
assert len(steps) == 120, f"expected 120 step records, got {len(steps)}"
for key in ("step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_mem_mib"):
    assert key in steps[0], f"metrics record lacks {key}"
assert steps[-1]["loss"] < steps[0]["loss"], "training loss did not decrease"
assert val < bound, f"val loss {val} not below the context-free bound {bound}"
print(f"learns: val loss {val:.4f} < context-free bound {bound:.4f} (entropy rate {src['entropy_rate_nats']:.4f})")
PY
