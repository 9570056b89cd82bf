#!/usr/bin/env bash
# Lockstep against PyTorch CPU on the same model, the same initial parameters and the same tokens:
#   scripts/compare_pytorch.sh bench_small|bench_medium [STEPS] [fp32|bf16]
# bf16: Lockstep's bf16 recipe (--train.precision=bf16) against PyTorch's bf16 autocast (fp32
# parameters and AdamW, bf16 GEMMs); the step-1 loss check below is fp32's and is skipped.
# For 1 and 2 threads: `lockstep bench` (fast mode, fp32) and the PyTorch rebuild of the model
# (scripts/compare_pytorch.py) run the same warm-up + STEPS (default 10) steps, alternating, in
# COMPARE_ROUNDS rounds (default 2); each side's figure is its best round (tokens/s at the median
# step), so that a busy moment on a shared machine does not decide the ratio. The script prints
# every round, both figures, their ratio, and which GEMM each side ran (Lockstep's fast mode runs
# its own where OpenBLAS's kernel is narrower than the CPU). Then the step-1 losses of Lockstep
# (fast and canonical) and PyTorch are checked against
# the fp64 loss within a first-order bound derived from the operands (compare_pytorch.py, bound_step1);
# exit 1 if a check fails.
#
# PyTorch at its best on this CPU: these machines set OPENBLAS_CORETYPE=Haswell (AVX2 kernels).
# Here only, OpenBLAS is pinned to SkylakeX (AVX-512) when the CPU has avx512f, for both sides, and
# PyTorch also runs on Debian's OpenMP build of OpenBLAS (libopenblas0-openmp, installed here when
# missing, selected through LD_LIBRARY_PATH; the system default stays pthread); the faster PyTorch
# variant is the one compared. COMPARE_CORETYPE=machine keeps the environment's OPENBLAS_CORETYPE
# instead (the out-of-the-box comparison; tests/e2e/compare_pytorch.sh uses it, since tests and CI
# never change that variable).
# Env: LOCKSTEP (the binary, default build/bin/lockstep), COMPARE_THREADS (default "1 2"),
# COMPARE_ROUNDS (default 2).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
name="${1:-}"
steps="${2:-10}"
precision="${3:-fp32}"
case "$precision" in fp32 | bf16) ;; *) echo "compare_pytorch: precision must be fp32 or bf16, got '$precision'" >&2; exit 2 ;; esac
autocast=off
[ "$precision" = bf16 ] && autocast=bf16
case "$name" in
  bench_small | bench_medium) ;;
  *) echo "usage: scripts/compare_pytorch.sh bench_small|bench_medium [STEPS] [fp32|bf16]" >&2; exit 2 ;;
esac
config="$root/scripts/configs/$name.toml"
lockstep="${LOCKSTEP:-$root/build/bin/lockstep}"
[ -x "$lockstep" ] || { echo "compare_pytorch: $lockstep not found; build first (scripts/build.sh) or set LOCKSTEP" >&2; exit 2; }
py=/usr/bin/python3  # Debian's python, where python3-torch and python3-numpy live
omp_dir=/usr/lib/x86_64-linux-gnu/openblas-openmp
extra=(python3-torch)  # and PyTorch at its best may need the OpenMP OpenBLAS; out of the box it does not
if [ "${COMPARE_CORETYPE:-best}" != machine ] && [ ! -e "$omp_dir/libblas.so.3" ]; then extra=(libopenblas0-openmp); fi
if ! "$py" -c "import torch, numpy" 2>/dev/null || [ ${#extra[@]} -gt 1 ]; then
  echo "compare_pytorch: installing what is missing with scripts/setup.sh"
  "$root/scripts/setup.sh" "${extra[@]}"
fi

if [ "${COMPARE_CORETYPE:-best}" = machine ]; then
  core="${OPENBLAS_CORETYPE:-}"
elif grep -q -w avx512f /proc/cpuinfo; then
  core=SkylakeX
else
  core=Haswell
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
warmup=2
batch="$(sed -n 's/^batch_size *= *\([0-9]*\).*/\1/p' "$config")"

echo "compare_pytorch: $name, $precision, $warmup warm-up + $steps timed steps, OPENBLAS_CORETYPE=${core:-unset} here (machine: ${OPENBLAS_CORETYPE:-unset}); load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$lockstep" ckpt export --config "$config" "$work/init.safetensors" >/dev/null

field() {  # field FILE KEY: a top-level JSON value
  "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}
py_common=(--weights "$work/init.safetensors" --tokens "$work/tokens.bin" --lockstep-json "$work/ls.json" --batch "$batch")

best() {  # best FILE...: the file with the highest tokens_per_s
  "$py" -c 'import json,sys; print(max(sys.argv[1:], key=lambda f: json.load(open(f))["tokens_per_s"]))' "$@"
}

fail=0
for t in ${COMPARE_THREADS:-1 2}; do
  export OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t
  if [ -n "$core" ]; then export OPENBLAS_CORETYPE=$core; fi
  for round in $(seq 1 "${COMPARE_ROUNDS:-2}"); do
    "$lockstep" bench --config "$config" --train.mode=fast --train.precision="$precision" --train.threads="$t" --bench.warmup=$warmup \
      --bench.steps="$steps" --json "$work/ls_${t}_$round.json" --tokens-out "$work/tokens.bin" >/dev/null
    cp "$work/ls_${t}_$round.json" "$work/ls.json"
    line="  threads $t round $round: Lockstep $(printf %.0f "$(field "$work/ls.json" tokens_per_s)")"
    for variant in pthread openmp; do
      lib=()
      if [ "$variant" = openmp ]; then
        [ -e "$omp_dir/libblas.so.3" ] || continue
        lib=(env "LD_LIBRARY_PATH=$omp_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
      fi
      "${lib[@]}" "$py" "$root/scripts/compare_pytorch.py" time "${py_common[@]}" --threads "$t" --warmup $warmup \
        --autocast "$autocast" \
        >"$work/pt_${t}_${round}_$variant.json"
      line+=", PyTorch on $variant OpenBLAS $(printf %.0f "$(field "$work/pt_${t}_${round}_$variant.json" tokens_per_s)")"
    done
    echo "$line tokens/s"
  done
  [ -e "$omp_dir/libblas.so.3" ] || echo "  (PyTorch on OpenMP OpenBLAS: not installed; apt-get install libopenblas0-openmp)"
  ls_best="$(best "$work"/ls_"${t}"_*.json)"
  pt_best="$(best "$work"/pt_"${t}"_*.json)"
  cp "$ls_best" "$work/ls_$t.json"
  cp "$pt_best" "$work/pt_$t.json"
  variant="$(basename "$pt_best" .json)"
  "$py" - "$work/ls_$t.json" "$work/pt_$t.json" "$t" "${variant##*_}" <<'EOF'
import json, sys
ls, pt = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
t, variant = sys.argv[3], sys.argv[4]
gemm = ls['fast_gemm'] if ls['precision'].startswith('fp32') else f"{ls['bf16_kernel']} for the bf16 linears, {ls['fast_gemm']}"
print(f"threads {t}: Lockstep fast {ls['precision'].split()[0]} {ls['tokens_per_s']:.0f} tokens/s ({gemm}, "
      f"step {ls['step_ms_median']:.1f} ms), PyTorch {pt['tokens_per_s']:.0f} tokens/s ({variant} OpenBLAS "
      f"{pt['openblas_core']}, autocast {pt['autocast']}, step {pt['step_ms_median']:.1f} ms); Lockstep / PyTorch = "
      f"{ls['tokens_per_s'] / pt['tokens_per_s']:.3f} (best of each side's rounds)")
EOF
done

# Step-1 losses against the fp64 loss (the tokens and learning rates are the same at every thread count).
if [ "$precision" != fp32 ]; then exit $fail; fi
first_t="$(echo ${COMPARE_THREADS:-1 2} | cut -d' ' -f1)"
"$lockstep" bench --config "$config" --train.mode=canonical --train.threads=1 --bench.warmup=0 --bench.steps=1 \
  --json "$work/canon.json" >/dev/null
cp "$work/ls_$first_t.json" "$work/ls.json"
"$py" "$root/scripts/compare_pytorch.py" bound "${py_common[@]}" --threads 2 >"$work/bound.json"
"$py" - "$work/bound.json" "$work/ls_$first_t.json" "$work/canon.json" "$work/pt_$first_t.json" <<'EOF' || fail=1
import json, sys
b = json.load(open(sys.argv[1]))
exact, bound, prob = b["loss_fp64"], b["bound"], b["bound_probabilistic"]
sides = {"Lockstep fast": json.load(open(sys.argv[2]))["losses"][0],
         "Lockstep canonical": json.load(open(sys.argv[3]))["losses"][0],
         "PyTorch fp32": json.load(open(sys.argv[4]))["losses"][0]}
print(f"step-1 loss: fp64 {exact:.9f}; first-order bound on any fp32 evaluation {bound:.3e} worst case, "
      f"{prob:.3e} probabilistic (lambda {b['lambda']:g}); {b['nodes']} rounding sites, u = 2^-24; "
      f"derivation: compare_pytorch.py bound_step1")
ok = True
for side, loss in sides.items():
    err = abs(loss - exact)
    ok &= err <= bound
    print(f"  {side:19s} {loss:.9f}  |diff| {err:.3e} = {err / bound:.2e} of the bound, {err / prob:.2e} of the "
          f"probabilistic one  {'ok' if err <= bound else 'EXCEEDS'}")
gap = abs(sides["Lockstep fast"] - sides["PyTorch fp32"])
ok &= gap <= 2 * bound
print(f"  Lockstep fast vs PyTorch fp32 |diff| {gap:.3e} = {gap / (2 * bound):.2e} of twice the bound  "
      f"{'ok' if gap <= 2 * bound else 'EXCEEDS'}")
sys.exit(0 if ok else 1)
EOF
exit $fail
