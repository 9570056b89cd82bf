#!/usr/bin/env bash
# `lockstep bisect` against a tensor- and sequence-parallel side: one process (A) vs tp2 with
# sequence parallelism (B, canonical mode, so the layouts agree bitwise until the fault). A bit
# flipped on tp rank 1 in its shard of layer 1's QKV at step 3 is found at that step, and because
# the tp side's dump holds global tensors the op is named, with its input bitwise equal.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
# tp = 2 with sequence parallelism in canonical mode: d_model / 2, vocab_size / 2 and a micro-batch's
# tokens / 2 on 64-element chunks.
a='--config cfg.toml --train.threads=1 --parallel.timeout_s=60 --model.vocab_size=384 --model.d_model=128'
b="$a --parallel.tp=2 --parallel.sp=true --inject.site=layer/1/attn/qkv --inject.step=3 --inject.rank=1"
status=0
"$LOCKSTEP" bisect --a="$a" --b="$b --inject.kind=bitflip:bit=27,index=300" --b-np=2 --steps=6 --out=flip \
  > flip.txt 2> flip.err || status=$?
[ "$status" -eq 1 ] || fail "tp2 sp bit flip: expected exit 1, got $status: $(cat flip.txt flip.err)"
/usr/bin/python3 - flip/bisect.json <<'PY' || fail "tp2 sp bit flip: $(cat flip.txt)"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["diverged"] and r["step"] == 3, r["step"]
assert r["op"] == "layer/1/attn/qkv", (r["op"], r["op_note"])
# One pass of each side, then at most `every` steps per side to refine and one to dump.
assert r["steps_reexecuted"] <= 2 * r["every"] + 2, r["steps_reexecuted"]
PY
grep -q 'inputs layer/1/ln1/out (bitwise equal)' flip.txt || fail "the op's input is not reported equal: $(cat flip.txt)"
echo "bisect_tp: a bit flip on tp rank 1 of a tp2 sp run found at step 3, op layer/1/attn/qkv"
