# Shared helpers of the end-to-end tests. Each test script is called as
#   script.sh LOCKSTEP_BINARY WORKDIR SOURCE_DIR
# and sources this file; it runs in a fresh WORKDIR and exits non-zero on the first failure.
set -euo pipefail
LOCKSTEP=$1
WORK=$2
SRC=$3
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK"

fail() { echo "FAIL: $*" >&2; exit 1; }

# Whether the script runs its full campaign (set by a wrapper in e2e/slow/, label `slow`) rather
# than the default suite's share of it.
full_campaign() { [ "${LS_E2E_FULL:-0}" = 1 ]; }

# A small Markov data set in ./data (fast to make; enough tokens for a few hundred windows).
make_data() {
  "$LOCKSTEP" data synth --out data --order 2 --alphabet 8 --branch 3 --tokens 200000 --seed 7 >/dev/null
  "$LOCKSTEP" data build --input data/corpus.txt --out data >/dev/null
}

# A config for a model small enough that a step takes tens of milliseconds.
write_config() {
  cat > "${1:-cfg.toml}" <<'TOML'
[model]
vocab_size = 257
seq_len = 64
d_model = 64
n_layers = 2
n_heads = 4
seed = 11

[data]
train = "data/train.bin"
val = "data/val.bin"

[train]
steps = 40
batch_size = 8
micro_batch_size = 4
lr = 1e-3
min_lr = 1e-4
warmup = 4
seed = 5
mode = "canonical"
threads = 2
peak_gflops = 100

[log]
every = 10

[eval]
every = 0
batches = 2
TOML
}

# write_tp_config VOCAB D_MODEL: write_config's model with that vocabulary and width (chosen so
# that tensor parallelism's split reductions fall on 64-element chunks) and a 60 s watchdog.
write_tp_config() {
  write_config
  sed -i -e "s/^vocab_size = .*/vocab_size = $1/" -e "s/^d_model = .*/d_model = $2/" cfg.toml
  printf '[parallel]\ntimeout_s = 60\n' >> cfg.toml
}

# The pipeline scripts' model: write_tp_config 384 128 with four blocks (11 layers, enough for pp4 x
# 2 virtual stages) and an evaluation every 10 steps.
write_pipeline_config() {
  write_tp_config 384 128
  sed -i -e 's/^n_layers = .*/n_layers = 4/' -e 's/^every = 0$/every = 10/' cfg.toml
}

# expect_error "regex" command...: the command must exit with status 2 and print one line
# `error: ...` matching the regex on stderr.
expect_error() {
  local pattern=$1
  shift
  local status=0
  "$@" >out.log 2>err.log || status=$?
  [ "$status" -eq 2 ] || fail "expected exit 2 from '$*', got $status; stderr: $(cat err.log)"
  [ "$(wc -l < err.log)" -eq 1 ] || fail "expected one error line from '$*', got: $(cat err.log)"
  grep -Eq "^error: .*$pattern" err.log || fail "error from '$*' does not match /$pattern/: $(cat err.log)"
}

# expect_mpi_error PATTERN ARGS...: the script's own `mpi` launcher run with ARGS must exit 2 and
# print one line `error: ...` matching PATTERN: an error every rank meets is printed once.
expect_mpi_error() {
  local pattern=$1
  shift
  local status=0
  mpi "$@" > err.log 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "expected exit 2 from '$*', got $status: $(cat err.log)"
  [ "$(grep -c '^error: ' err.log)" -eq 1 ] || fail "expected one error line from '$*', got: $(cat err.log)"
  grep -Eq "^error: .*$pattern" err.log || fail "error from '$*' does not match /$pattern/: $(cat err.log)"
}

model_hash() { grep '^model hash ' "$1" | awk '{print $3}'; }

# same_hash NAME LOG [WANT]: LOG's model hash must be WANT (default: the script's $want).
same_hash() {
  local got expected=${3:-${want:-}}
  got=$(model_hash "$2")
  [ "$got" = "$expected" ] || fail "$1: model hash '$got' != single-process $expected: $(tail -3 "$2")"
}

# A 20-step run's LOG: its step-20 line without the timing, its evaluation line.
step20() { grep '^step *20/' "$1" | sed 's/ | [0-9]* tok\/s.*//'; }
eval20() { grep '^eval step 20 ' "$1"; }

# same_run NAME LOG VAL: LOG ends on the single-process model ($want) and step-20 line ($loss), and
# its evaluation line is VAL.
same_run() {
  same_hash "$1" "$2"
  [ "$(step20 "$2")" = "$loss" ] || fail "$1: $(step20 "$2") vs $loss"
  [ "$(eval20 "$2")" = "$3" ] || fail "$1: $(eval20 "$2") vs $3"
}

# on_hash NAME WANT NP ARGS...: the script's `mpi` on NP ranks with ARGS ends on WANT.
on_hash() {
  local name=$1 hash=$2 np=$3
  shift 3
  mpi "$np" "$@" > "$name.log" 2>&1 || fail "$name: $(tail -5 "$name.log")"
  same_hash "$name" "$name.log" "$hash"
}

# one_process NAME ARGS...: the model hash the script's one-process `run` with ARGS ends on.
one_process() {
  local name=$1
  shift
  run "$@" > "$name.log" 2>&1 || fail "$name: $(tail -5 "$name.log")"
  model_hash "$name.log"
}

# fast_within_bounds ARGS... -- "NP NAME FLAGS..."...: the script's one-process `run` and its `mpi`
# on each layout, both with ARGS in fast mode, dump every tensor of two steps; `lockstep diff
# --bounds` must find each layout's every tensor within its op-local bound of the one process's.
fast_within_bounds() {
  local extra=()
  while [ "$1" != "--" ]; do extra+=("$1"); shift; done
  shift
  local fast=(--train.mode=fast --train.stop_after=1 --checkpoint.every=1 "${extra[@]}") layout np name flags
  rm -rf ck_fast fast_single  # a second call's single run starts afresh
  run "${fast[@]}" --checkpoint.dir=ck_fast --dump.dir=fast_single > fast_single.log 2>&1 \
    || fail "fast single: $(tail -5 fast_single.log)"
  for layout in "$@"; do
    read -r np name flags <<< "$layout"
    # shellcheck disable=SC2086
    mpi "$np" "${fast[@]}" --checkpoint.dir="ck_fast_$name" --dump.dir="fast_$name" $flags > "fast_$name.log" 2>&1 \
      || fail "fast $name: $(tail -5 "fast_$name.log")"
    "$LOCKSTEP" diff fast_single "fast_$name" --bounds --ckpt-a=ck_fast --ckpt-b="ck_fast_$name" > "fast_$name.txt" \
      || fail "fast $name outside its op-local bounds: $(head -1 "fast_$name.txt"); $(awk '$3 != 0' "fast_$name.txt" | head -4)"
  done
}

# reference_clean NAME ARGS...: the script's `run` for 20 steps with sampled reference checks every
# step and ARGS passes every op's bound: no finding, and the summary of 20 ops re-checked on rank 0.
reference_clean() {
  local name=$1
  shift
  steps=20 run --verify.reference_every=1 "$@" > "reference_$name.log" 2>&1 \
    || fail "reference checks $name: $(tail -3 "reference_$name.log")"
  if grep -q '^finding' "reference_$name.log"; then fail "reference checks $name: $(grep '^finding' "reference_$name.log")"; fi
  grep -q '^reference checks: 20 ops re-checked on rank 0' "reference_$name.log" \
    || fail "reference checks $name: no summary: $(tail -3 "reference_$name.log")"
}

# reference_fault SITE BIT: a persistent flip of bit BIT of element 3 of SITE's output from step 0
# stops the script's `run` (20 steps, reference checks every step) with exit 6 and a finding at SITE.
reference_fault() {
  local status=0
  steps=20 run --verify.reference_every=1 --inject.site="$1" --inject.step=0 --inject.persistent=true \
    --inject.kind=bitflip:bit="$2",index=3 > reference_fault.log 2>&1 || status=$?
  [ "$status" -eq 6 ] || fail "reference fault: expected exit 6, got $status: $(tail -3 reference_fault.log)"
  grep -q "^finding: after step [0-9]*, detector reference, site $1 " reference_fault.log \
    || fail "reference fault not named: $(grep -E '^(finding|error)' reference_fault.log)"
}
