#!/usr/bin/env bash
# [train] init_from: a run starts from the parameters of a safetensors file. The initial parameters
# exported by `lockstep ckpt export --config` give the run the seed's own model hash; the same
# parameters written under Hugging Face GPT-2 names, Conv1D matrices transposed and in bf16 where
# they are bf16 values, give it too (one process, dp2 x tp2 and pp2 x tp2); a trained checkpoint's export
# starts a run whose first loss is the trained model's. A missing parameter, a wrong shape and a
# file that is not safetensors are one error line each, naming the file and the tensor.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
# d_model 128 and a vocabulary of 384 keep tp2's split reductions on 64-element chunks.
write_tp_config 384 128
steps=4
run() { "$LOCKSTEP" train --config cfg.toml --train.steps=$steps --train.threads=1 --log.every=1 "$@"; }

run > seed.log
want=$(model_hash seed.log)
"$LOCKSTEP" ckpt export --config cfg.toml init.safetensors > /dev/null
run --train.init_from=init.safetensors > lockstep_names.log
grep -q '^initial parameters from init.safetensors: [0-9]* tensors$' lockstep_names.log ||
  fail "no start-up line: $(grep '^initial' lockstep_names.log)"
[ "$(model_hash lockstep_names.log)" = "$want" ] || fail "init_from the exported seed parameters changed the run"

# The same parameters as a Hugging Face GPT-2 file: transformer.h.N.* names, Conv1D (in, out)
# matrices, the layer norms in bf16 (exact: they are ones and zeros), plus an attention mask buffer.
/usr/bin/python3 - init.safetensors hf.safetensors <<'PY'
import json, struct, sys
import numpy as np
src, dst = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n]); data = raw[8 + n:]
parts = {"ln1": "ln_1", "ln2": "ln_2", "attn/qkv": "attn.c_attn", "attn/proj": "attn.c_proj",
         "mlp/fc": "mlp.c_fc", "mlp/proj": "mlp.c_proj"}
out = {}
for name, e in header.items():
    if name == "__metadata__": continue
    a = np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]], dtype=np.float32).reshape(e["shape"])
    if name in ("wte", "wpe"):
        out["transformer." + name + ".weight"] = a
    elif name.startswith("lnf/"):
        out["transformer.ln_f." + name.split("/")[1]] = a
    else:
        _, layer, rest = name.split("/", 2)
        module, kind = rest.rsplit("/", 1)
        hf = f"transformer.h.{layer}.{parts[module]}.{kind}"
        out[hf] = a.T.copy() if (kind == "weight" and module not in ("ln1", "ln2")) else a
out["transformer.h.0.attn.bias"] = np.tril(np.ones((4, 4), dtype=np.float32))
head, blobs, off = {}, [], 0
for k, a in out.items():
    bf16 = k.endswith(("ln_1.weight", "ln_1.bias"))
    b = (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes() if bf16 else a.astype("<f4").tobytes()
    head[k] = {"dtype": "BF16" if bf16 else "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(head).encode(); h += b" " * ((8 - len(h) % 8) % 8)
open(dst, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
run --train.init_from=hf.safetensors > hf.log || fail "HF names: $(tail -3 hf.log)"
grep -q '^initial parameters from hf.safetensors: [0-9]* tensors (Hugging Face GPT-2 names); not used: 1 (transformer.h.0.attn.bias)$' hf.log ||
  fail "HF start-up line: $(grep '^initial' hf.log)"
[ "$(model_hash hf.log)" = "$want" ] || fail "init_from with Hugging Face names changed the run"
mpirun --oversubscribe -np 4 "$LOCKSTEP" train --config cfg.toml --train.steps=4 --train.threads=1 --parallel.dp=2 \
  --parallel.tp=2 --train.init_from=hf.safetensors > hf_tp.log 2>&1 || fail "dp2 x tp2: $(tail -3 hf_tp.log)"
[ "$(model_hash hf_tp.log)" = "$want" ] || fail "init_from under dp2 x tp2 changed the run"
# Pipeline stages each take their own tensors (the last stage's copy of the tied wte from the first).
mpirun --oversubscribe -np 4 "$LOCKSTEP" train --config cfg.toml --train.steps=4 --train.threads=1 --parallel.pp=2 \
  --parallel.tp=2 --train.micro_batch_size=1 --train.init_from=hf.safetensors > hf_pp.log 2>&1 ||
  fail "pp2 x tp2: $(tail -3 hf_pp.log)"
[ "$(model_hash hf_pp.log)" = "$want" ] || fail "init_from under pp2 x tp2 changed the run"

# A trained model's export: the new run's first loss is the trained model's loss on its batch.
steps=20 run --checkpoint.dir=ck > trained.log
"$LOCKSTEP" ckpt export ck trained.safetensors > /dev/null
steps=1 run --train.init_from=trained.safetensors > from_trained.log
first=$(grep '^step      1/1 ' from_trained.log | sed 's/.*loss \([0-9.]*\).*/\1/')
fresh=$(grep '^step      1/4 ' seed.log | sed 's/.*loss \([0-9.]*\).*/\1/')
/usr/bin/python3 -c "import sys; sys.exit(0 if float('$first') < float('$fresh') - 0.5 else 1)" ||
  fail "a run from the trained parameters starts at loss $first, the seed's at $fresh"

expect_error 'init.safetensors: no tensor for the model.s parameter .layer/2/ln1/weight. \[128\]' \
  run --model.n_layers=3 --train.init_from=init.safetensors
expect_error "init.safetensors: tensor 'wte' is \[384, 128\], the model's 'wte' needs \[512, 128\]" \
  run --model.vocab_size=512 --train.init_from=init.safetensors
head -c 100 init.safetensors > cut.safetensors
expect_error 'cut.safetensors: header length [0-9]* runs past the file' run --train.init_from=cut.safetensors
echo PASS
