#!/usr/bin/env bash
# Mutation check: proof that the kernel tests and `lockstep verify step` bite (issue 3, part 6).
#
# Copies the committed tree (git archive HEAD; --worktree: the tracked files as they are now) into
# a temporary directory, builds test_property, the kernel unit-test binaries (the op test driver
# among them) and the lockstep CLI once (Release, LOCKSTEP_CUDA=OFF, -j2), checks that the tests
# pass unmutated, and trains three tiny models 2 steps with the unmutated CLI (d_model 32, 2
# layers, seq_len 16; "ln": LayerNorm, GELU, learned positions, biases; "rms": RMSNorm, SwiGLU,
# RoPE, GQA, untied, no biases; "hot": ln with init_std 2, attention scores in the hundreds), checkpointing after step 2. From those checkpoints
# the unmutated CLI must pass `verify step` in the four setups canon-ln, canon-rms (canonical mode,
# bitwise against the CanonicalF32 emulation), fast-ln and fast-hot (fast mode, within the
# Bounded<mpfr> bounds; fast-ln on OpenBLAS sgemm, fast-hot on Lockstep's fast GEMM, whatever the
# machine's OpenBLAS kernel). Between them every mutated kernel runs.
# Then for every scripts/mutants/*.patch: applies it, rebuilds (only the touched kernel files
# recompile), runs every test binary and records which tests failed, runs the mutant CLI's
# `verify step` in the four setups against the unmutated checkpoints and records which setups
# failed (and the worst tensor each names), and reverts the patch. A mutant is caught by the tests
# when at least one test fails, by verify step when at least one setup exits non-zero. A patch whose
# header (before the diff) has a line "Verify-step: not applicable: REASON" plants a bug that model
# data cannot reach (e.g. a fallback only adversarial operands take): only the tests must catch it,
# and its row says why verify step was not run.
# Prints one row per mutant with both verdicts, "N/M mutants caught by the tests" and "N/M caught
# by verify step"; exits 1 if any mutant escaped either, 2 if the unmutated tree does not build,
# pass its tests or pass verify step (then no mutant result would mean anything).
#
# Usage: scripts/mutation_check.sh [--worktree] [--keep] [--jobs N] [mutant-name ...]
# Environment: LS_MUTATION_DIR (work dir, default a mktemp dir), RC_PARAMS (default noshrink=1:
# a caught mutant needs one counterexample, not a minimal one).
# Not here: the default ctest run (this is the `mutation` label, enabled by -DLS_MUTATION_TESTS=ON).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source_mode=head
keep=0
jobs=2
selected=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --worktree) source_mode=worktree ;;
    --keep) keep=1 ;;
    --jobs) jobs="$2"; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) selected+=("$1") ;;
  esac
  shift
done

work="${LS_MUTATION_DIR:-$(mktemp -d /tmp/lockstep-mutation.XXXXXX)}"
mkdir -p "$work"
cleanup() { if [[ $keep -eq 0 && -z "${LS_MUTATION_DIR:-}" ]]; then rm -rf "$work"; fi; }
trap cleanup EXIT

src="$work/src"
build="$work/build"
logs="$work/logs"
rm -rf "$src" "$logs"
mkdir -p "$src" "$logs"
if [[ $source_mode == head ]]; then
  git -C "$root" archive HEAD | tar -x -C "$src"
else
  (cd "$root" && git ls-files -z | xargs -0 tar -c) | tar -x -C "$src"
fi
echo "mutation check: tree from $source_mode in $src"

binaries=(test_property test_unit_kernels test_unit_kernels_attention test_unit_kernels_elementwise test_unit_kernels_ops)
export RC_PARAMS="${RC_PARAMS:-noshrink=1}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

build_all() {
  cmake --build "$build" -j"$jobs" --target "${binaries[@]}" lockstep_cli >"$1" 2>&1
}

# run_all LOG: runs every binary, writes "binary: FailedTest" lines to LOG.failed; returns the
# number of failing binaries.
run_all() {
  local log="$1" bad=0
  : >"$log.failed"
  for b in "${binaries[@]}"; do
    if ! (cd "$build" && timeout 900 "./bin/$b" --gtest_brief=1) >"$log.$b" 2>&1; then
      bad=$((bad + 1))
      local failed
      failed="$(grep -E '^\[  FAILED  \] [A-Za-z0-9_]+\.[A-Za-z0-9_]+' "$log.$b" | sed -E 's/^\[  FAILED  \] ([^ ]+).*/\1/' | sort -u | tr '\n' ' ')"
      [[ -z "$failed" ]] && failed="(exit status, no gtest failure line: crash or timeout)"
      echo "$b: $failed" >>"$log.failed"
    fi
  done
  return $bad
}

cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=OFF >"$logs/configure.log" 2>&1 ||
  { echo "configure failed: $logs/configure.log"; keep=1; exit 2; }
echo "building ${binaries[*]} (unmutated)"
build_all "$logs/build.baseline.log" || { echo "baseline build failed: $logs/build.baseline.log"; keep=1; exit 2; }
if ! run_all "$logs/run.baseline"; then
  echo "the unmutated tree fails its own tests; fix that first:"
  cat "$logs/run.baseline.failed"
  keep=1
  exit 2
fi
echo "baseline: all kernel tests pass"

# ---- verify step: tiny checkpoints trained by the unmutated CLI ----
vdir="$work/verify"
rm -rf "$vdir"
mkdir -p "$vdir"
cli="$build/bin/lockstep"
# write_verify_config FILE MODEL_LINES: a 2-layer d_model 32 model, 3 steps of 4 sequences of 16
# tokens, checkpoints every step (step 2's is the one verified: its step 3 is replayed).
write_verify_config() {
  cat >"$1" <<TOML
[model]
vocab_size = 257
seq_len = 16
d_model = 32
n_layers = 2
n_heads = 4
seed = 11
$2

[data]
train = "$vdir/data/train.bin"

[train]
steps = 3
batch_size = 4
micro_batch_size = 4
lr = 1e-3
min_lr = 1e-4
warmup = 1
seed = 5
mode = "canonical"
threads = 2
peak_gflops = 100

[checkpoint]
dir = "$vdir/ck-$(basename "$1" .toml)"
every = 1
keep = 0
TOML
}
"$cli" data synth --out "$vdir/data" --order 2 --alphabet 8 --branch 3 --tokens 20000 --seed 7 \
  >"$logs/verify.data.log" 2>&1 &&
  "$cli" data build --input "$vdir/data/corpus.txt" --out "$vdir/data" >>"$logs/verify.data.log" 2>&1 ||
  { echo "verify data failed: $logs/verify.data.log"; keep=1; exit 2; }
write_verify_config "$vdir/ln.toml" 'norm = "layernorm"
ffn = "gelu"
pos = "learned"
bias = true
tie_embeddings = true'
# "hot": the ln model with init_std 2, whose attention scores reach a few hundred: exp overflows
# there unless softmax subtracts the row maximum (a healthy early model never shows that).
write_verify_config "$vdir/hot.toml" 'norm = "layernorm"
ffn = "gelu"
pos = "learned"
bias = true
tie_embeddings = true
init_std = 2.0'
write_verify_config "$vdir/rms.toml" 'norm = "rmsnorm"
ffn = "swiglu"
ffn_hidden = 48
pos = "rope"
n_kv_heads = 2
bias = false
tie_embeddings = false'
for cfg in ln rms hot; do
  "$cli" train --config "$vdir/$cfg.toml" >"$logs/verify.train.$cfg.log" 2>&1 &&
    [[ -d "$vdir/ck-$cfg/step_00000002" ]] ||
    { echo "training the $cfg checkpoint failed: $logs/verify.train.$cfg.log"; keep=1; exit 2; }
done
# setup name, config, extra options
setups=("canon-ln ln" "canon-rms rms" "fast-ln ln --train.mode=fast --train.fast_gemm=openblas"
        "fast-hot hot --train.mode=fast --train.fast_gemm=lockstep")

# run_verify LOG: runs the built CLI's verify step in every setup, writes "setup: worst tensor"
# lines (or the exit status when no summary line came) to LOG.failed; returns the number failing.
run_verify() {
  local log="$1" bad=0 setup name cfg extra status
  : >"$log.failed"
  for setup in "${setups[@]}"; do
    read -r name cfg extra <<<"$setup"
    status=0
    # shellcheck disable=SC2086  # extra is empty or options, one word each
    timeout 900 "$cli" verify step --config "$vdir/$cfg.toml" --checkpoint "$vdir/ck-$cfg/step_00000002" \
      $extra >"$log.$name" 2>&1 || status=$?
    if [[ $status -ne 0 ]]; then
      bad=$((bad + 1))
      if grep -q '^verify step: FAIL' "$log.$name"; then
        echo "$name: $(grep '^verify step: FAIL' "$log.$name" | sed -E 's/.*worst tensor ([^ ,;]+).*/\1/')" >>"$log.failed"
      else
        echo "$name: exit $status, $(tail -1 "$log.$name")" >>"$log.failed"
      fi
    fi
  done
  return $bad
}
if ! run_verify "$logs/verify.baseline"; then
  echo "the unmutated CLI fails verify step; fix that first:"
  cat "$logs/verify.baseline.failed"
  keep=1
  exit 2
fi
echo "baseline: verify step passes (${setups[*]%% *})"

mutants=()
if [[ ${#selected[@]} -gt 0 ]]; then
  for m in "${selected[@]}"; do mutants+=("$root/scripts/mutants/$m.patch"); done
else
  mutants=("$root"/scripts/mutants/*.patch)
fi

caught=0
vcaught=0
vna=0
total=0
table=()
for patch in "${mutants[@]}"; do
  name="$(basename "$patch" .patch)"
  total=$((total + 1))
  if ! (cd "$src" && patch -p1 -s --forward <"$patch"); then
    table+=("$(printf '%-40s %s' "$name" "PATCH DOES NOT APPLY (counted as survived by both)")")
    continue
  fi
  start=$(date +%s)
  if ! build_all "$logs/build.$name.log"; then
    verdict="BUILD FAILED (counted as survived by both): $logs/build.$name.log"
  else
    if run_all "$logs/run.$name"; then
      verdict="tests: SURVIVED"
    else
      caught=$((caught + 1))
      verdict="tests: caught by $(tr '\n' ' ' <"$logs/run.$name.failed")"
    fi
    na_reason="$(sed -n 's/^Verify-step: not applicable: //p' "$patch" | head -1)"
    if [[ -n "$na_reason" ]]; then
      vna=$((vna + 1))
      verdict+=" | verify step: not applicable ($na_reason)"
    elif run_verify "$logs/verify.$name"; then
      verdict+=" | verify step: SURVIVED (${setups[*]%% *} all pass)"
    else
      vcaught=$((vcaught + 1))
      verdict+=" | verify step: caught in $(tr '\n' ' ' <"$logs/verify.$name.failed")"
    fi
  fi
  (cd "$src" && patch -p1 -s -R <"$patch")
  row="$(printf '%-40s %4ss  %s' "$name" "$(($(date +%s) - start))" "$verdict")"
  echo "$row"
  table+=("$row")
done

echo
echo "mutant                                   time  result"
printf '%s\n' "${table[@]}"
echo "$caught/$total mutants caught by the tests"
echo "$vcaught/$((total - vna)) mutants caught by verify step ($vna not applicable)"
if [[ -n "${LS_MUTATION_DIR:-}" || $keep -eq 1 ]]; then echo "logs: $logs"; fi
[[ $caught -eq $total && $((vcaught + vna)) -eq $total ]]
