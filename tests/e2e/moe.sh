#!/usr/bin/env bash
# Mixture of experts: MoE layers (4 experts, top-2) in place of the MLPs, trained from the CLI.
#  - canonical mode: one model hash for 1, 2 and 3 threads, AVX2, micro-batches of 1 and 4
#    sequences, full recomputation, dp2 (zero 0 and 2), dp4 zero 1, tp2, dp2 x tp2, tp2 and dp2 x
#    tp2 with sequence parallelism, pp2, dp2 zero 3 and a resume from a checkpoint; with a capacity
#    that drops tokens (SwiGLU experts, sigmoid router; also tp2 sp), with aux-loss-free balancing
#    (selection biases moved each step; resumed bitwise), with two shared experts (also tp2, and
#    tp2 sp), with
#    bf16 linears, and with fp8 linears under Hopper accumulation, one hash each over their layouts;
#  - the metrics JSONL has each MoE layer's per-expert counts every step: every token's two
#    choices counted, the kept ones within the capacity; a dropping run drops some;
#  - `lockstep moe report` prints each layer's load and drops and draws them, and with --ep the
#    busiest expert-parallel rank's load;
#  - the model learns (the loss falls);
#  - verify step passes a MoE run's step bitwise against the reference's emulation, also one with
#    selection biases (read from the checkpoint); sampled reference checks while training pass a
#    clean run and name a corrupted router;
#  - bad input: top_k above the experts — one line.
source "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
make_data
write_config
base=(--config cfg.toml --model.seq_len=128 --model.vocab_size=512 --model.d_model=128 --model.moe_experts=4
      --model.moe_top_k=2 --model.moe_ffn_hidden=128 --parallel.timeout_s=60)
common=("${base[@]}" --train.steps=4)
run() { "$LOCKSTEP" train "${common[@]}" "$@"; }
# A thread a rank: the ranks share the cores (the thread counts' bits are the one process's runs).
mpi() { local np=$1; shift; mpirun --oversubscribe -np "$np" "$LOCKSTEP" train "${common[@]}" --train.threads=1 "$@"; }
# layouts NAME ARGS...: the run with ARGS under several layouts, each on the one-process hash.
layouts() {
  local name=$1
  shift
  run "$@" > "$name.log" 2>&1 || fail "$name: $(tail -5 "$name.log")"
  local want
  want=$(model_hash "$name.log")
  [ -n "$want" ] || fail "$name: no model hash"
  run "$@" --train.micro_batch_size=1 > "${name}_mb1.log" 2>&1
  same_hash "$name, micro-batches of one sequence" "${name}_mb1.log" "$want"
  mpi 2 "$@" --parallel.dp=2 > "${name}_dp2.log" 2>&1 || fail "$name dp2: $(tail -5 "${name}_dp2.log")"
  same_hash "$name, dp2" "${name}_dp2.log" "$want"
}

run --log.metrics=m.jsonl > single.log 2>&1 || fail "single: $(tail -5 single.log)"
want=$(model_hash single.log)
[ -n "$want" ] || fail "no model hash in single.log"
grep -Eq "^moe: load max/mean [0-9.]+ \(layer/[01]/moe\), dropped 0.00%" single.log \
  || fail "no moe line: $(grep -E '^moe' single.log)"
for t in 1 3; do
  run --train.threads=$t > t$t.log 2>&1
  same_hash "$t threads" t$t.log
done
run --train.isa=avx2 > avx2.log 2>&1
same_hash "AVX2" avx2.log
run --train.micro_batch_size=1 > mb1.log 2>&1
same_hash "micro-batches of one sequence" mb1.log
run --train.recompute=full > recompute.log 2>&1
same_hash "full recomputation" recompute.log
for zero in 0 2; do
  mpi 2 --parallel.dp=2 --parallel.zero=$zero > dp2_z$zero.log 2>&1 || fail "dp2 zero $zero: $(tail -5 dp2_z$zero.log)"
  same_hash "dp2 zero $zero" dp2_z$zero.log
done
mpi 4 --parallel.dp=4 --parallel.zero=1 --train.micro_batch_size=1 > dp4.log 2>&1 || fail "dp4: $(tail -5 dp4.log)"
same_hash "dp4 zero 1" dp4.log
mpi 2 --parallel.tp=2 > tp2.log 2>&1 || fail "tp2: $(tail -5 tp2.log)"
same_hash "tp2" tp2.log
mpi 4 --parallel.tp=2 --parallel.dp=2 --parallel.zero=1 > dp2tp2.log 2>&1 || fail "dp2 x tp2: $(tail -5 dp2tp2.log)"
same_hash "dp2 x tp2" dp2tp2.log
mpi 2 --parallel.tp=2 --parallel.sp=true > sp2.log 2>&1 || fail "tp2 sp: $(tail -5 sp2.log)"
same_hash "tp2 with sequence parallelism" sp2.log
mpi 4 --parallel.tp=2 --parallel.sp=true --parallel.dp=2 --parallel.zero=2 > dp2sp2.log 2>&1 \
  || fail "dp2 x tp2 sp: $(tail -5 dp2sp2.log)"
same_hash "dp2 x tp2 with sequence parallelism, zero 2" dp2sp2.log
mpi 2 --parallel.pp=2 > pp2.log 2>&1 || fail "pp2: $(tail -5 pp2.log)"
same_hash "pp2" pp2.log
mpi 2 --parallel.dp=2 --parallel.zero=3 > z3.log 2>&1 || fail "zero 3: $(tail -5 z3.log)"
same_hash "dp2 zero 3" z3.log
run --checkpoint.dir=ck --checkpoint.every=2 --train.stop_after=1 > first.log 2>&1
run --checkpoint.dir=ck --checkpoint.every=2 > resumed.log 2>&1
grep -q "^resumed from ck/step_00000002" resumed.log || fail "did not resume: $(head -5 resumed.log)"
same_hash "resumed" resumed.log

drop=(--model.moe_capacity_factor=1 --model.ffn=swiglu --model.moe_router=sigmoid)
layouts capacity "${drop[@]}" --log.metrics=drop.jsonl
[ "$(model_hash capacity.log)" != "$want" ] || fail "the capacity run ended on the dropless hash"
mpi 2 "${drop[@]}" --parallel.tp=2 --parallel.sp=true > capacity_sp2.log 2>&1 || fail "capacity sp: $(tail -5 capacity_sp2.log)"
same_hash "capacity, tp2 sp" capacity_sp2.log "$(model_hash capacity.log)"
bias=(--model.moe_bias_update=0.01 --model.moe_aux_weight=0)
layouts bias "${bias[@]}" --log.metrics=bias.jsonl
run "${bias[@]}" --checkpoint.dir=ckb --checkpoint.every=2 --train.stop_after=1 > bias_first.log 2>&1
run "${bias[@]}" --checkpoint.dir=ckb --checkpoint.every=2 > bias_resumed.log 2>&1
grep -q "^resumed from ckb/step_00000002" bias_resumed.log || fail "bias run did not resume"
same_hash "selection biases resumed" bias_resumed.log "$(model_hash bias.log)"
layouts shared --model.moe_shared_experts=2
mpi 2 --model.moe_shared_experts=2 --parallel.tp=2 > shared_tp2.log 2>&1 || fail "shared tp2: $(tail -5 shared_tp2.log)"
same_hash "shared experts, tp2" shared_tp2.log "$(model_hash shared.log)"
mpi 2 --model.moe_shared_experts=2 --parallel.tp=2 --parallel.sp=true > shared_sp2.log 2>&1 \
  || fail "shared sp: $(tail -5 shared_sp2.log)"
same_hash "shared experts, tp2 sp" shared_sp2.log "$(model_hash shared.log)"
layouts bf16 --train.precision=bf16
layouts fp8 --train.precision=fp8 --fp8.accumulate=hopper

# Every step's record: each layer's choices are its tokens x top_k; kept within routed; drops
# only with a capacity.
python3 - m.jsonl drop.jsonl bias.jsonl <<'PY'
import json, sys
def records(path):
    return [r["moe"] for r in map(json.loads, open(path)) if "moe" in r]
for path, dropping in ((sys.argv[1], False), (sys.argv[2], True)):
    steps = records(path)
    assert len(steps) == 4, (path, len(steps))
    dropped = 0
    for step in steps:
        assert sorted(step) == ["layer/0/moe", "layer/1/moe"], sorted(step)
        for name, layer in step.items():
            assert sum(layer["routed"]) == 8 * 128 * 2, (path, name, layer["routed"])
            assert all(0 <= k <= r for k, r in zip(layer["kept"], layer["routed"])), (path, name, layer)
            assert 1 <= layer["load"] <= 4 and 0 < layer["entropy"] and layer["aux_loss"] > 0, (path, name, layer)
            dropped += layer["dropped"]
    assert (dropped > 0) == dropping, (path, dropped)
# The selection biases move by 0.01 a step towards the mean load, from zero.
steps = records(sys.argv[3])
for step, record in enumerate(steps, 1):
    for name, layer in record.items():
        assert len(layer["bias"]) == 4 and all(abs(b) <= 0.01 * step + 1e-6 for b in layer["bias"]), (name, layer)
assert any(b != 0 for layer in steps[-1].values() for b in layer["bias"]), steps[-1]
assert all("bias" not in layer for record in records(sys.argv[1]) for layer in record.values())
PY

# The report: every layer's line, the drops of the capacity run, an SVG; a dense run's metrics have none.
"$LOCKSTEP" moe report drop.jsonl --out load.svg > report.txt || fail "moe report: $(cat report.txt)"
grep -q "^moe report: 2 MoE layers, 4 steps, 4 experts each" report.txt || fail "report header: $(head -2 report.txt)"
[ "$(grep -cE '^  layer/[01]/moe +load [0-9.]+ -> [0-9.]+ \(worst [0-9.]+\) +dropped [0-9.]+% -> [0-9.]+%' report.txt)" = 2 ] \
  || fail "report lines: $(cat report.txt)"
grep -q "dropped share of the choices" load.svg && head -c 5 load.svg | grep -q "<svg" || fail "no drop plot in load.svg"
# Under expert parallelism over 2 ranks (experts 0-1 and 2-3): the busiest rank's routed rows over
# the mean, summed over the layers, at the last step (4 steps: the last tenth is one), as
# `lockstep plan --moe-load` takes it; counted here from the records.
"$LOCKSTEP" moe report drop.jsonl --ep 2 > report_ep.txt || fail "moe report --ep: $(cat report_ep.txt)"
python3 - drop.jsonl report_ep.txt <<'PY' || fail "moe report --ep 2: $(tail -2 report_ep.txt)"
import json, re, sys
last = [json.loads(l)["moe"] for l in open(sys.argv[1]) if "moe" in json.loads(l)][-1]
busiest = sum(max(sum(l["routed"][:2]), sum(l["routed"][2:])) for l in last.values())
mean = sum(sum(l["routed"]) / 2 for l in last.values())
m = re.search(r"^expert parallelism over 2 ranks \(2 experts each\): .* -> ([0-9.]+) \(worst [0-9.]+\); "
              r"lockstep plan --moe-load ([0-9.]+)$", open(sys.argv[2]).read(), re.M)
assert m and abs(float(m.group(1)) - busiest / mean) < 5e-4 and m.group(1) == m.group(2), (m and m.groups(), busiest / mean)
PY
expect_error "--ep: 3 does not divide the run's 4 experts" "$LOCKSTEP" moe report drop.jsonl --ep 3
"$LOCKSTEP" train --config cfg.toml --train.steps=2 --log.metrics=dense.jsonl > dense.log 2>&1
expect_error "dense.jsonl: no moe records" "$LOCKSTEP" moe report dense.jsonl

# Sampled reference checks ([verify] reference_every) take the MoE layers' norm and router in turn:
# a clean run has no finding; a router whose logits are corrupted in every step is named.
"$LOCKSTEP" train "${base[@]}" --train.steps=20 --verify.reference_every=1 > refcheck.log 2>&1 \
  || fail "reference checks: $(tail -3 refcheck.log)"
if grep -q '^finding' refcheck.log; then fail "reference checks: $(grep '^finding' refcheck.log)"; fi
grep -q '^reference checks: 20 ops re-checked on rank 0' refcheck.log || fail "reference checks: $(tail -3 refcheck.log)"
status=0
"$LOCKSTEP" train "${base[@]}" --train.steps=20 --verify.reference_every=1 --inject.site=layer/1/moe/router \
  --inject.step=0 --inject.persistent=true --inject.kind=bitflip:bit=27,index=3 > reffault.log 2>&1 || status=$?
[ "$status" -eq 6 ] || fail "router fault: expected exit 6, got $status: $(tail -3 reffault.log)"
grep -q "^finding: after step [0-9]*, detector reference, site layer/1/moe/router " reffault.log \
  || fail "router fault not named: $(grep -E '^(finding|error)' reffault.log)"

# The model learns: the loss falls over 40 steps.
"$LOCKSTEP" train "${base[@]}" --train.steps=40 --log.every=1 > learn.log 2>&1
first=$(sed -nE 's/^step +1\/40 \| loss ([0-9.]+).*/\1/p' learn.log)
last=$(sed -nE 's/^step +40\/40 \| loss ([0-9.]+).*/\1/p' learn.log)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 1) }' || fail "loss did not fall: $first -> $last"

expect_error "moe_top_k \(5\) must be in \[1, moe_experts = 4\]" \
  "$LOCKSTEP" train --config cfg.toml --model.moe_experts=4 --model.moe_top_k=5
# verify step: the last step of a run, bitwise against the reference's emulation; also of a run
# with selection biases, which the reference reads from the checkpoint as the trainer does.
run --checkpoint.dir=vck --checkpoint.every=1 --checkpoint.keep=0 > vck.log 2>&1
"$LOCKSTEP" verify step "${common[@]}" --checkpoint vck/step_00000003 > verify.log 2>&1 || fail "verify step: $(tail -5 verify.log)"
grep -q "^verify step: PASS" verify.log || fail "verify step: $(tail -3 verify.log)"
grep -Eq "^grad/layer/0/moe/expert/3/fc/weight .* bitwise .* ok$" verify.log || fail "no expert gradient row: $(grep expert verify.log | head -3)"
run "${bias[@]}" --checkpoint.dir=vckb --checkpoint.every=1 --checkpoint.keep=0 > vckb.log 2>&1
"$LOCKSTEP" verify step "${common[@]}" "${bias[@]}" --checkpoint vckb/step_00000003 > verify_bias.log 2>&1 \
  || fail "verify step with selection biases: $(tail -5 verify_bias.log)"
grep -q "^verify step: PASS" verify_bias.log || fail "verify step with selection biases: $(tail -3 verify_bias.log)"
echo "moe: ok"
