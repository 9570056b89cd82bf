#!/usr/bin/env bash
# ZeRO-2 with gradient accumulation: each rank runs several micro-batches, and zero 2 reduces each
# micro-batch's buckets as the backward finishes them, into the rank's gradient shard.
#  - canonical mode, reduce = exact: dp2 (4 micro-batches per rank), dp4 (2) and dp2 x tp2 with
#    sequence parallelism off and on (4) end with the single process's model hash, replicas equal
#    after every step;
#  - the gradient storage a rank holds (the first step's parallel line, grad_bytes in the metrics)
#    is smaller under zero 2 than under zero 1 and than the full buffers, with buckets of 16 KB;
#  - fast mode, dp2 zero 2 with 4 micro-batches per rank: every tensor of 2 steps within the single
#    process's op-local bounds (`lockstep diff --bounds`).
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
# One sequence per micro-batch; seq_len 128 keeps a tp2 sequence-parallel micro-batch on whole
# 64-token chunks, and 512 vocabulary rows and d_model 128 split over tp2 on them too.
common=(--config cfg.toml --train.steps=4 --train.threads=1 --train.micro_batch_size=1 --model.seq_len=128 --model.vocab_size=512
        --model.d_model=128
        --parallel.bucket_mb=0.015625)
run() { "$LOCKSTEP" train "${common[@]}" "$@"; }
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$LOCKSTEP" train "${common[@]}" \
  --parallel.timeout_s=60 --verify.replicas=true "$@"; }

run > single.log
want=$(model_hash single.log)
[ -n "$want" ] || fail "no model hash in single.log"
mpi 2 --parallel.zero=2 --log.metrics=dp2_z2.jsonl > dp2_z2.log 2>&1 || fail "dp2 zero 2 failed: $(tail -5 dp2_z2.log)"
same_hash "dp2 zero 2, 4 micro-batches" dp2_z2.log
mpi 4 --parallel.zero=2 > dp4_z2.log 2>&1 || fail "dp4 zero 2 failed: $(tail -5 dp4_z2.log)"
same_hash "dp4 zero 2, 2 micro-batches" dp4_z2.log
for sp in false true; do
  mpi 4 --parallel.dp=2 --parallel.tp=2 --parallel.zero=2 --parallel.sp=$sp > dp2tp2_sp$sp.log 2>&1 \
    || fail "dp2 x tp2 zero 2 sp $sp failed: $(tail -5 dp2tp2_sp$sp.log)"
  same_hash "dp2 x tp2 zero 2 sp $sp, 4 micro-batches" dp2tp2_sp$sp.log
done

# Gradient storage: zero 2 below zero 1, and below the full buffers.
mpi 2 --parallel.zero=1 --log.metrics=dp2_z1.jsonl > dp2_z1.log 2>&1 || fail "dp2 zero 1 failed: $(tail -5 dp2_z1.log)"
storage() { sed -nE 's/.*gradient storage ([0-9]+) bytes per rank \(full buffers: ([0-9]+)\).*/\1 \2/p' "$1"; }
read -r z2 full < <(storage dp2_z2.log)
read -r z1 _ < <(storage dp2_z1.log)
[ -n "$z2" ] && [ -n "$z1" ] || fail "no gradient storage in the parallel lines: $(grep '^parallel' dp2_z2.log dp2_z1.log)"
[ "$z2" -lt "$z1" ] && [ "$z2" -lt "$full" ] || fail "zero 2 holds $z2 gradient bytes, zero 1 $z1, full buffers $full"
python3 - dp2_z2.jsonl dp2_z1.jsonl <<'PY' || fail "grad_bytes: zero 2 not below zero 1 in the metrics"
import json, sys
z2, z1 = ([r["grad_bytes"] for r in map(json.loads, open(p)) if "grad_bytes" in r] for p in sys.argv[1:3])
assert len(z2) == len(z1) == 4 and max(z2) < min(z1), (z2, z1)
PY

# Fast mode: within the single process's op-local bounds.
fast=(--train.mode=fast --train.stop_after=1 --checkpoint.every=1 --checkpoint.keep=8)
run "${fast[@]}" --checkpoint.dir=ck_single --dump.dir=single > fast_single.log
mpi 2 "${fast[@]}" --parallel.zero=2 --checkpoint.dir=ck_dp2 --dump.dir=dp2 > fast_dp2.log 2>&1 \
  || fail "fast dp2 zero 2 failed: $(tail -5 fast_dp2.log)"
"$LOCKSTEP" diff single dp2 --bounds --ckpt-a=ck_single --ckpt-b=ck_dp2 > fast_diff.txt ||
  fail "fast dp2 zero 2 outside its op-local bounds: $(head -1 fast_diff.txt); $(awk '$3 != 0' fast_diff.txt | head -4)"
echo "zero2_micro: dp2, dp4, dp2 x tp2 (sp off/on) zero 2 with several micro-batches: model hash $want = single process;" \
  "gradient storage $z2 bytes per rank (zero 1: $z1, full buffers: $full); fast dp2 zero 2 within bounds"
