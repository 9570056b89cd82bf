#!/usr/bin/env bash
# Context parallelism: every sequence's positions split over cp ranks in zig-zag blocks, the
# attention against every rank's keys and values.
#  - canonical mode: the one-process model hash for cp2, cp4, cp2 x dp2 zero 2, cp2 x tp2 with
#    sequence parallelism, cp2 with selective recomputation, RoPE with RMSNorm, SwiGLU and
#    grouped-query attention, and bf16 linears, each on its own one-process hash; the ring
#    (cp_comm = "p2p", the blockwise attention) runs most of them (zero 2, sp, recomputation, cp4,
#    RoPE, shared experts), the all-gather the others; the full campaign
#    (e2e/slow/parallel_layouts.sh) adds cp2 x dp2 zero 1 with micro-batches of one sequence, zero 3,
#    cp2 x tp2 without sp and grouped-query attention alone;
#  - MoE: cp2 with token dropping, cp2 x ep2 and shared experts on the one-process hash, the
#    per-expert statistics the one process's (the full campaign: also cp4, cp2 x tp2 with sp and
#    aux-loss-free balancing);
#  - evaluation: the cp ranks evaluate each window together and give the one process's val loss;
#  - a rank holds T / cp positions: the layout line says so and the attention's traffic is counted;
#  - checkpoints: a cp2 run's checkpoint resumes under cp2 x dp2 over the ring and on one process
#    bitwise;
#  - verified collectives cover the cp group: a clean run has no finding, a flipped bit in a k/v
#    gather is found and named;
#  - canonical dumps of cp2, cp2 x dp2 (the ring: every tensor but the probabilities it does not
#    hold) and MoE cp2 runs are bitwise the one process's, tensor by tensor;
#  - fast mode: cp2 x tp2 over the ring (the full campaign: also cp2 x dp2 and MoE cp2) dumps
#    every tensor of 2 steps (of 2 sequences) as global tensors, and `lockstep diff --bounds` finds
#    each within its op-local bound of the one-process fast run;
#  - bad input: a sequence that cp cannot cut into whole 64-position chunks, cp with pipeline
#    parallelism, a cp that does not divide the ranks, an unknown cp_comm, a fault injected into the
#    probabilities the ring does not hold — one line each.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
sed -i -e 's/^seq_len = .*/seq_len = 256/' cfg.toml
sed -e 's/^seq_len = .*/seq_len = 512/' cfg.toml > long.toml
common=(--model.vocab_size=512 --model.d_model=128 --parallel.timeout_s=60 --train.steps=4 --train.threads=1)
# The runs read cfg.toml (T = 256), or $config.
run() { "$LOCKSTEP" train --config "${config:-cfg.toml}" "${common[@]}" "$@"; }
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$LOCKSTEP" train --config "${config:-cfg.toml}" "${common[@]}" "$@"; }

want=$(one_process single)
[ -n "$want" ] || fail "no model hash in single.log"
on_hash cp2 "$want" 2 --parallel.cp=2
ring=(--parallel.cp_comm=p2p)
on_hash cp2_dp2_z2 "$want" 4 --parallel.cp=2 --parallel.dp=2 --parallel.zero=2 "${ring[@]}"
on_hash cp2_tp2_sp "$want" 4 --parallel.cp=2 --parallel.tp=2 --parallel.sp=true "${ring[@]}"
on_hash cp2_recompute "$want" 2 --parallel.cp=2 --train.recompute=selective "${ring[@]}"
config=long.toml on_hash cp4 "$(config=long.toml one_process long)" 4 --parallel.cp=4 "${ring[@]}"
llama=(--model.pos=rope --model.norm=rmsnorm --model.ffn=swiglu --model.n_kv_heads=2)
on_hash cp2_llama "$(one_process llama "${llama[@]}")" 2 --parallel.cp=2 "${llama[@]}" "${ring[@]}"
on_hash cp2_bf16 "$(one_process bf16 --train.precision=bf16)" 2 --parallel.cp=2 --train.precision=bf16
if full_campaign; then
  on_hash cp2_dp2_z1 "$want" 4 --parallel.cp=2 --parallel.dp=2 --parallel.zero=1 --train.micro_batch_size=1
  on_hash cp2_z3 "$want" 2 --parallel.cp=2 --parallel.zero=3
  on_hash cp2_tp2 "$want" 4 --parallel.cp=2 --parallel.tp=2
  gqa=(--model.n_kv_heads=2)
  on_hash cp2_gqa "$(one_process gqa "${gqa[@]}")" 2 --parallel.cp=2 "${gqa[@]}" "${ring[@]}"
fi

# MoE: each cp rank routes the whole micro-batch (a sequence's capacity and balancing loss span its
# positions) and computes its own tokens' rows.
moe=(--model.moe_experts=4 --model.moe_top_k=2 --model.moe_ffn_hidden=128 --model.moe_capacity_factor=1.0
     --model.moe_aux_weight=0.01 --log.moe=true --log.every=1)
moe_want=$(one_process moe "${moe[@]}")
on_hash cp2_moe "$moe_want" 2 --parallel.cp=2 "${moe[@]}"
grep -q '^moe: .*dropped [1-9]' moe.log || fail "no dropped tokens to test: $(grep '^moe:' moe.log | tail -1)"
[ "$(grep '^moe:' cp2_moe.log)" = "$(grep '^moe:' moe.log)" ] || fail "cp2 MoE statistics: $(grep '^moe:' cp2_moe.log | tail -1)"
on_hash cp2_ep2_moe "$moe_want" 4 --parallel.cp=2 --parallel.ep=2 "${moe[@]}"
shared=(--model.moe_shared_experts=1)
on_hash cp2_moe_shared "$(one_process moe_shared "${moe[@]}" "${shared[@]}")" 2 --parallel.cp=2 "${moe[@]}" "${shared[@]}" \
  "${ring[@]}"
if full_campaign; then
  on_hash cp2_tp2_sp_moe "$moe_want" 4 --parallel.cp=2 --parallel.tp=2 --parallel.sp=true "${moe[@]}"
  config=long.toml on_hash cp4_moe "$(config=long.toml one_process long_moe "${moe[@]}")" 4 --parallel.cp=4 "${moe[@]}"
  free=(--model.moe_experts=4 --model.moe_top_k=2 --model.moe_ffn_hidden=128 --model.moe_bias_update=0.001)
  on_hash cp2_moe_free "$(one_process moe_free "${free[@]}")" 2 --parallel.cp=2 "${free[@]}"
fi

grep -q "cp 2 x ep 1 x pp 1 (world 2), cp_comm all_gather" cp2.log || fail "no cp in the layout line: $(grep '^parallel' cp2.log)"
grep -q "cp_comm p2p" cp4.log || fail "no ring in the layout line: $(grep '^parallel' cp4.log)"
grep -Eq "context parallel [1-9][0-9]*\)" cp2.log || fail "no context-parallel bytes: $(grep '^parallel' cp2.log)"

# Evaluation: every window on both cp ranks, each its positions; the val loss is the one process's.
val_losses() { python3 -c "import json, sys; print([r['val_loss'] for r in map(json.loads, open(sys.argv[1])) if 'val_loss' in r])" "$1"; }
eval=(--eval.every=2 --eval.batches=3)
run "${eval[@]}" --log.metrics=eval_one.jsonl > eval_one.log 2>&1 || fail "eval: $(tail -3 eval_one.log)"
mpi 4 "${eval[@]}" --log.metrics=eval_cp2.jsonl --parallel.cp=2 --parallel.dp=2 > eval_cp2.log 2>&1 \
  || fail "eval cp2: $(tail -3 eval_cp2.log)"
[ "$(val_losses eval_cp2.jsonl)" = "$(val_losses eval_one.jsonl)" ] \
  || fail "eval cp2 x dp2: $(val_losses eval_cp2.jsonl) != $(val_losses eval_one.jsonl)"

# A cp2 checkpoint (step 2) resumes under cp2 x dp2 (zero 1) and on one process, bitwise.
mpi 2 --parallel.cp=2 --checkpoint.dir=ck --checkpoint.every=2 --train.stop_after=1 > ck_first.log 2>&1 \
  || fail "cp2 checkpoint: $(tail -5 ck_first.log)"
"$LOCKSTEP" ckpt info ck/step_00000002 > info.log 2>&1 || fail "ckpt info: $(cat info.log)"
grep -q "^layout cp=2 dp=1 pp=1 tp=1" info.log || fail "ckpt info layout: $(cat info.log)"
cp -r ck ck_one
on_hash resumed_cp2_dp2 "$want" 4 --parallel.cp=2 --parallel.dp=2 --parallel.zero=1 --checkpoint.dir=ck \
  --checkpoint.every=2 "${ring[@]}"
grep -q "^resumed from ck/step_00000002" resumed_cp2_dp2.log || fail "cp2 x dp2 did not resume: $(head -5 resumed_cp2_dp2.log)"
run --checkpoint.dir=ck_one --checkpoint.every=2 > resumed_one.log 2>&1
grep -q "^resumed from ck_one/step_00000002" resumed_one.log || fail "one process did not resume"
same_hash "cp2 checkpoint resumed on one process" resumed_one.log

# Verified collectives: a clean cp2 run has no finding and the one-process hash; a bit flipped in
# a k/v gather as rank 1 receives it is a finding naming the operation on cp and the sender.
on_hash checked_cp2 "$want" 2 --parallel.cp=2 --verify.collectives=true
grep -q '^finding' checked_cp2.log && fail "a clean cp2 run reported: $(grep '^finding' checked_cp2.log)"
status=0
mpi 2 --parallel.cp=2 --verify.collectives=true --inject.site=comm/cp/all_gatherv --inject.step=1 --inject.rank=1 \
  --inject.kind=bitflip:bit=28,index=5 > cp_flip.log 2>&1 || status=$?
[ "$status" -eq 6 ] || fail "cp flip: expected exit 6, got $status: $(tail -3 cp_flip.log)"
grep -Eq '^finding: after step 2, detector collectives, site all_gatherv on cp, ranks 1: .*world rank\(s\) 0 ' cp_flip.log \
  || fail "cp flip: no finding naming rank 1 and its peer 0: $(grep -E '^(finding|error)' cp_flip.log)"

# Canonical dumps: every tensor of the first two steps, gathered over cp (and dp), bitwise the one
# process's.
run --train.stop_after=1 --dump.dir=dump_single > dump_single.log 2>&1 || fail "dump: $(tail -3 dump_single.log)"
for layout in "2 cp2 --parallel.cp=2" "4 cp2_dp2 --parallel.cp=2 --parallel.dp=2 --parallel.cp_comm=p2p"; do
  read -r np name flags <<< "$layout"
  # shellcheck disable=SC2086
  mpi "$np" --train.stop_after=1 --dump.dir="dump_$name" $flags > "dump_$name.log" 2>&1 || fail "$name dump: $(tail -3 "dump_$name.log")"
  "$LOCKSTEP" diff dump_single "dump_$name" > "dump_$name.txt" || fail "$name dump differs: $(head -3 "dump_$name.txt")"
  grep -Eq "^diff dump_single dump_$name \(mode exact\): agree \([0-9]+ tensors\)" "dump_$name.txt" \
    || fail "$name dump diff: $(head -2 "dump_$name.txt")"
done
# The ring's dump lacks the probabilities alone.
grep -q "^only in dump_single: .*attn/att" dump_cp2_dp2.txt || fail "ring dump: attn/att $(grep -c '^only in' dump_cp2_dp2.txt)"
! grep '^only in' dump_cp2_dp2.txt | grep -qv 'attn/att' || fail "ring dump lacks: $(grep '^only in' dump_cp2_dp2.txt | head -3)"
! grep -q '^only in' dump_cp2.txt || fail "cp2 dump lacks: $(grep '^only in' dump_cp2.txt | head -3)"
run --train.stop_after=1 --dump.dir=dump_moe "${moe[@]}" > dump_moe.log 2>&1 || fail "MoE dump: $(tail -3 dump_moe.log)"
mpi 2 --train.stop_after=1 --dump.dir=dump_cp2_moe --parallel.cp=2 "${moe[@]}" > dump_cp2_moe.log 2>&1 ||
  fail "cp2 MoE dump: $(tail -3 dump_cp2_moe.log)"
"$LOCKSTEP" diff dump_moe dump_cp2_moe > dump_cp2_moe.txt || fail "cp2 MoE dump differs: $(head -3 dump_cp2_moe.txt)"

# Fast mode: within the one-process run's op-local bounds, tensor by tensor.
fast_layouts=("4 cp2_tp2 --parallel.cp=2 --parallel.tp=2 --parallel.cp_comm=p2p")
full_campaign && fast_layouts+=("4 cp2_dp2 --parallel.cp=2 --parallel.dp=2 --parallel.zero=1")
fast_within_bounds --train.batch_size=2 --train.micro_batch_size=1 -- "${fast_layouts[@]}"
if full_campaign; then
  fast_within_bounds --train.batch_size=2 --train.micro_batch_size=1 "${moe[@]}" -- "2 cp2_moe --parallel.cp=2"
fi

expect_mpi_error "\[parallel\] cp = 4 needs \[model\] seq_len \(256\) to be a multiple of 2 x cp x 64 = 512" \
  4 --parallel.cp=4
expect_mpi_error "\[parallel\] cp = 2 does not run with pipeline parallelism \(\[parallel\] pp\) yet" \
  4 --parallel.cp=2 --parallel.pp=2
expect_mpi_error "x cp \(3\) = 3 must divide the number of ranks \(2\)" 2 --parallel.cp=3
expect_mpi_error "\[parallel\] cp_comm must be \"all_gather\" or \"p2p\" \(got \"ring\"\)" 2 --parallel.cp=2 --parallel.cp_comm=ring
expect_mpi_error "\[inject\] site layer/0/attn/att: \[parallel\] cp_comm = \"p2p\" holds no attention probabilities" \
  2 --parallel.cp=2 --parallel.cp_comm=p2p --inject.site=layer/0/attn/att --inject.step=0 --inject.kind=bitflip:bit=28,index=5
echo "context parallelism: OK"
