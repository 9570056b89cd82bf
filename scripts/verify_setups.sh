#!/usr/bin/env bash
# `lockstep verify step` in every setup of tests/verify_setups.txt (or the NAMEs given).
#
#   scripts/verify_setups.sh [--cli BIN] [--train-cli BIN] [--work DIR] [--phase all|prepare|check]
#                            [--logs DIR] [--first-failure] [NAME ...]
#
# prepare: makes a small Markov data set in DIR/data and, for each setup, trains the base model of
#   the table 3 steps with the row's options (less those of verify step alone: --reference.*,
#   --verify.*), checkpointing every step (DIR/NAME.toml, DIR/ck-NAME),
#   with --train-cli (default --cli).
# check: runs --cli's `verify step` on each setup's step-2 checkpoint with the row's options and
#   prints one line per setup: "NAME: PASS (gradient ...)" or "NAME: FAIL ..." — the worst tensor
#   of a failed comparison, the exit status and last line of a run that did not report, or the
#   clipping branch when the step left the row's; each run's output goes to LOGS/NAME.log.
#   --first-failure stops at the first setup that fails.
# all (default): both; without --work in a temporary directory, removed when every setup passes.
# Exits 0 when every setup passes, 1 otherwise, 2 on a set-up failure.
# The mutation check prepares once with the unmutated CLI and checks with each mutant's.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
table="$root/tests/verify_setups.txt"
cli="$root/build/bin/lockstep"
train_cli=""
work=""
logs=""
phase=all
first_failure=0
names=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cli) cli="$2"; shift ;;
    --train-cli) train_cli="$2"; shift ;;
    --work) work="$2"; shift ;;
    --logs) logs="$2"; shift ;;
    --phase) phase="$2"; shift ;;
    --first-failure) first_failure=1 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) names+=("$1") ;;
  esac
  shift
done
case "$phase" in all|prepare|check) ;; *) echo "error: --phase: expected all, prepare or check, got '$phase'" >&2; exit 2 ;; esac
if [[ -z "$work" ]]; then
  # A run of both phases in a directory of its own, removed when every setup passes; kept (and
  # named) otherwise, for its logs. The phases apart share a directory the caller names.
  [[ $phase == all ]] || { echo "error: --phase $phase needs --work DIR (the checkpoints live there)" >&2; exit 2; }
  work="$(mktemp -d "${TMPDIR:-/tmp}/lockstep-verify-setups.XXXXXX")"
  trap 'status=$?; if [[ $status -eq 0 ]]; then rm -rf "$work"; else echo "logs kept in $work/logs" >&2; fi' EXIT
fi
[[ -n "$train_cli" ]] || train_cli="$cli"
[[ -n "$logs" ]] || logs="$work/logs"
mkdir -p "$work" "$logs"

# The table's rows (name, gradient branch, options), those named on the command line if any.
rows=()
while read -r name branch options; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  rows+=("$name $branch $options")
done <"$table"
if [[ ${#names[@]} -gt 0 ]]; then
  chosen=()
  for n in "${names[@]}"; do
    found=""
    for r in "${rows[@]}"; do [[ "${r%% *}" == "$n" ]] && found="$r"; done
    [[ -n "$found" ]] || { echo "error: no setup '$n' in $table" >&2; exit 2; }
    chosen+=("$found")
  done
  rows=("${chosen[@]}")
fi

write_config() {  # FILE CHECKPOINT_DIR
  cat >"$1" <<TOML
[model]
vocab_size = 257
seq_len = 16
d_model = 32
n_layers = 2
n_heads = 4
seed = 11
norm = "layernorm"
ffn = "gelu"
pos = "learned"
bias = true
tie_embeddings = true

[data]
train = "$work/data/train.bin"

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
grad_clip = 1.0
peak_gflops = 100

[checkpoint]
dir = "$2"
every = 1
keep = 0
TOML
}

if [[ $phase != check ]]; then
  "$train_cli" data synth --out "$work/data" --order 2 --alphabet 8 --branch 3 --tokens 20000 --seed 7 \
    >"$logs/data.log" 2>&1 &&
    "$train_cli" data build --input "$work/data/corpus.txt" --out "$work/data" >>"$logs/data.log" 2>&1 ||
    { echo "error: making the data failed: $logs/data.log" >&2; exit 2; }
  for r in "${rows[@]}"; do
    read -r name branch options <<<"$r"
    rm -rf "$work/ck-$name"
    write_config "$work/$name.toml" "$work/ck-$name"
    train_options=()
    for o in $options; do [[ $o == --reference.* || $o == --verify.* ]] || train_options+=("$o"); done
    "$train_cli" train --config "$work/$name.toml" "${train_options[@]}" >"$logs/train.$name.log" 2>&1 &&
      [[ -d "$work/ck-$name/step_00000002" ]] ||
      { echo "error: training setup $name failed: $logs/train.$name.log" >&2; exit 2; }
  done
fi
[[ $phase == prepare ]] && exit 0

failed=0
checked=0
for r in "${rows[@]}"; do
  checked=$((checked + 1))
  read -r name branch options <<<"$r"
  log="$logs/$name.log"
  status=0
  # shellcheck disable=SC2086
  timeout 900 "$cli" verify step --config "$work/$name.toml" --checkpoint "$work/ck-$name/step_00000002" \
    $options >"$log" 2>&1 || status=$?
  gradient="$(grep -m1 '^gradient norm' "$log" || true)"
  if grep -q '^verify step: FAIL' "$log"; then
    line="FAIL worst tensor $(grep '^verify step: FAIL' "$log" | sed -E 's/.*worst tensor ([^ ,;]+).*/\1/')"
  elif [[ $status -ne 0 ]]; then
    line="FAIL exit $status: $(tail -1 "$log")"
  elif [[ $branch == clipped && "$gradient" != *": clipped" ]] ||
       [[ $branch == not-clipped && "$gradient" != *": not clipped" ]]; then
    line="FAIL the step is no longer $branch: $gradient"
  else
    line="PASS ($gradient)"
  fi
  [[ $line == PASS* ]] || failed=$((failed + 1))
  echo "$name: $line"
  [[ $failed -gt 0 && $first_failure -eq 1 ]] && break
done
echo "verify setups: $((checked - failed))/$checked pass$([[ $checked -lt ${#rows[@]} ]] && echo ", stopped at the first failure")"
[[ $failed -eq 0 ]]
