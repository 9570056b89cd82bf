#!/usr/bin/env bash
# `lockstep ckpt export`: a trained checkpoint and a config's initial parameters written as
# safetensors. The file is decoded here with plain Python (json + bytes, independent of the
# writer) and compared byte for byte with the checkpoint's own data file; the initial export must
# hold exactly the parameters a run with a zero fp32 learning rate keeps (same model hash, same bytes).
source "$(dirname "$0")/lib.sh"
make_data
write_config
py=/usr/bin/python3

"$LOCKSTEP" train --config cfg.toml --train.steps=3 --checkpoint.dir=ck > train.log
hash=$(model_hash train.log)
[ -n "$hash" ] || fail "no model hash in train.log"

"$LOCKSTEP" ckpt export ck trained.safetensors > export.log
grep -Eq "^exported [0-9]+ tensors of .*step_00000003 \(model hash $hash\) to trained.safetensors$" export.log \
  || fail "export line: $(cat export.log)"

# Every model/ tensor of the checkpoint, in manifest order, with the same dtype, shape and bytes.
check_against_checkpoint() {  # FILE CHECKPOINT_DIR
  "$py" - "$1" "$2" <<'PY'
import json, os, sys
path, ck = sys.argv[1], sys.argv[2]
blob = open(path, "rb").read()
n = int.from_bytes(blob[:8], "little")
assert (8 + n) % 8 == 0, f"data section starts at {8 + n}, not 8-byte aligned"
header = json.loads(blob[8:8 + n])
meta = header.pop("__metadata__")
data = blob[8 + n:]
manifest = json.load(open(os.path.join(ck, "manifest.json")))
model = [t for t in manifest["tensors"] if t["name"].startswith("model/")]
assert list(header) == [t["name"][len("model/"):] for t in model], f"names/order: {list(header)}"
end = 0
for t in model:
    h = header[t["name"][len("model/"):]]
    assert h["dtype"] == "F32" and h["shape"] == t["shape"], (t["name"], h)
    begin, stop = h["data_offsets"]
    assert begin == end, f"{t['name']}: data_offsets {h['data_offsets']} do not follow {end}"
    end = stop
    shard = t["shards"][0]
    with open(os.path.join(ck, shard["file"]), "rb") as f:
        f.seek(shard["offset"])
        assert f.read(shard["bytes"]) == data[begin:stop], f"{t['name']}: bytes differ from the checkpoint"
assert end == len(data), f"data section is {len(data)} bytes, tensors cover {end}"
print(meta["model_hash"])
PY
}
ck_dir=$(ls -d ck/step_*)
[ "$(check_against_checkpoint trained.safetensors "$ck_dir")" = "$hash" ] || fail "trained export's metadata hash"

# Initial parameters: a run whose learning rate is 0 in fp32 keeps them (AdamW's decoupled decay is
# lr-scaled too). The config requires lr > 0; 1e-50 passes that check in double and rounds to 0 as
# the fp32 learning rate the update uses.
"$LOCKSTEP" ckpt export --config cfg.toml init.safetensors > init.log
"$LOCKSTEP" train --config cfg.toml --train.steps=1 --train.lr=1e-50 --train.min_lr=1e-50 --train.warmup=0 \
  --checkpoint.dir=ck0 > train0.log
hash0=$(model_hash train0.log)
grep -q "(model hash $hash0)" init.log || fail "initial export hash vs lr=0 run $hash0: $(cat init.log)"
[ "$(check_against_checkpoint init.safetensors "$(ls -d ck0/step_*)")" = "$hash0" ] || fail "initial export's metadata hash"
"$py" - init.safetensors <<'PY' || fail "initial export metadata"
import json, sys
blob = open(sys.argv[1], "rb").read()
meta = json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])["__metadata__"]
want = {"vocab_size": "257", "seq_len": "64", "d_model": "64", "n_layers": "2", "n_heads": "4",
        "ffn": "gelu", "norm": "layernorm", "pos": "learned", "seed": "11"}
bad = {k: (meta.get(k), v) for k, v in want.items() if meta.get(k) != v}
assert not bad, bad
PY

expect_error "no such checkpoint directory" "$LOCKSTEP" ckpt export nope out.safetensors
expect_error "expected DIR OUT" "$LOCKSTEP" ckpt export ck
expect_error "needs --config FILE" "$LOCKSTEP" ckpt export ck out.safetensors --train.lr=1
expect_error "unknown verb 'reshard' \\(expected: info, verify, export, convert\\)" "$LOCKSTEP" ckpt reshard ck
[ ! -e out.safetensors ] || fail "a failed export left out.safetensors"
echo "safetensors_export: ok"
