#!/usr/bin/env bash
# Tensor dumps and `lockstep diff`: repeated canonical runs and thread counts agree bitwise
# (exit 0), fast mode diverges and diff names the first divergent tensor (exit 1), bad input is
# exit 2 naming the file, and numpy alone opens every dumped tensor with the manifest's shape.
source "$(dirname "$0")/lib.sh"
make_data
write_config
dump=(--train.steps=3 --train.micro_batch_size=2 --dump.steps=0-1,2
      "--dump.tensors=embed/out,layer/1/attn/*,logits,loss,grad/logits,grad/layer/0/mlp/*,grad/param/wte,param/lnf/*")

"$LOCKSTEP" train --config cfg.toml "${dump[@]}" --dump.dir=runA --train.threads=2 > a.log
"$LOCKSTEP" train --config cfg.toml "${dump[@]}" --dump.dir=runB --train.threads=2 > b.log
"$LOCKSTEP" train --config cfg.toml "${dump[@]}" --dump.dir=runC --train.threads=1 > c.log
"$LOCKSTEP" train --config cfg.toml "${dump[@]}" --dump.dir=runF --train.mode=fast > f.log
# Dumping does not change the run.
"$LOCKSTEP" train --config cfg.toml --train.steps=3 --train.micro_batch_size=2 > plain.log
[ "$(model_hash a.log)" = "$(model_hash plain.log)" ] || fail "dumping changed the model hash"

"$LOCKSTEP" diff runA runB --json ab.json > ab.txt || fail "repeated canonical runs differ: $(head -3 ab.txt)"
grep -q 'agree (' ab.txt || fail "diff runA runB does not say agree: $(head -2 ab.txt)"
"$LOCKSTEP" diff runA runC > ac.txt || fail "threads 1 vs 2 differ: $(head -3 ac.txt)"

status=0
"$LOCKSTEP" diff runA runF --json af.json --plot plots > af.txt || status=$?
[ "$status" -eq 1 ] || fail "canonical vs fast: expected exit 1, got $status: $(head -3 af.txt)"
grep -Eq 'DIVERGE; first divergent tensor step/0/[a-z]' af.txt || fail "no first divergent tensor: $(head -2 af.txt)"

# Bad input: exit 2 naming the file.
expect_error 'nothere/manifest.json' "$LOCKSTEP" diff runA nothere
expect_error 'mode: expected "exact" or "ulp:N"' "$LOCKSTEP" diff runA runB --mode=ulp:x
cp -r runB runT
npy=$(ls runT/step_1/*.npy | head -1)
truncate -s -4 "$npy"
expect_error "$npy: .*truncated" "$LOCKSTEP" diff runA runT
expect_error 'runA already holds a dump' "$LOCKSTEP" train --config cfg.toml "${dump[@]}" --dump.dir=runA
expect_error 'dump\] steps: expected steps like' "$LOCKSTEP" train --config cfg.toml --dump.dir=runX --dump.steps=1-x

# numpy alone reads the dump, and the diff JSON says what the table says.
/usr/bin/python3 - runA ab.json af.json <<'PY' || fail "numpy check failed"
import json, os, sys
import numpy
run, ab, af = sys.argv[1:4]
m = json.load(open(os.path.join(run, "manifest.json")))
assert m["format"] == "lockstep-dump" and m["version"] == 1, m["format"]
assert m["config"]["model"]["d_model"] == 64
names = [t["name"] for t in m["tensors"]]
assert len(names) == len(set(names)) and len(names) > 0
for t in m["tensors"]:
    a = numpy.load(os.path.join(run, t["file"]), allow_pickle=False)
    assert a.dtype == numpy.float32 and t["dtype"] == "float32", (t["name"], a.dtype)
    assert list(a.shape) == t["shape"], (t["name"], a.shape, t["shape"])
    assert a.flags["C_CONTIGUOUS"]
loss = numpy.load(os.path.join(run, "step_0/loss.npy"))
assert loss.shape == () and 4 < float(loss) < 7, loss
logits = numpy.load(os.path.join(run, "step_2/logits.npy"))
assert logits.shape == (8, 64, 257), logits.shape  # micro-batches of 2 concatenated: the whole batch
assert {t["step"] for t in m["tensors"]} == {0, 1, 2}
j = json.load(open(ab))
assert j["agree"] and j["first_divergent"] is None and j["compared"] == len(names)
assert all(t["bitwise_equal"] for t in j["tensors"])
j = json.load(open(af))
assert not j["agree"] and j["first_divergent"].startswith("step/0/")
first = next(t for t in j["tensors"] if not t["ok"])
assert first["name"] == j["first_divergent"] and first["mismatches"] > 0 and "first_mismatch" in first
print("numpy: %d tensors, shapes and dtypes match the manifest" % len(names))
PY

# --plot: two SVG files that parse as XML, with what they claim to show.
/usr/bin/python3 - plots/error_vs_step.svg plots/layer_heatmap.svg <<'PY' || fail "plot check failed"
import sys, xml.etree.ElementTree as ET
ns = "{http://www.w3.org/2000/svg}"
lines, heat = (ET.parse(p).getroot() for p in sys.argv[1:3])
assert len(lines.findall(ns + "polyline")) == 5  # activations, act. gradients, loss, param gradients, params
titles = [t.text for t in lines.iter(ns + "title")]
assert any(t.startswith("activations step 0: ") and not t.endswith(": 0") for t in titles), titles[:4]
cells = [t.text for t in heat.iter(ns + "title")]
assert any(c.startswith("layer 1 attn/qkv: ") for c in cells), cells[:4]
assert any(c.startswith("outside layers embed/out: bitwise equal") for c in cells)
assert any(c.startswith("layer 0 grad/mlp/act: ") and c[-1].isdigit() for c in cells)
PY
echo "dump_diff: canonical runs and threads 1/2 agree; fast mode first diverges at $(grep -o 'tensor step/[^ ]*' af.txt | head -1)"
