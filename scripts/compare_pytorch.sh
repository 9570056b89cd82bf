#!/usr/bin/env bash
# Lockstep against PyTorch CPU on the same model, the same initial parameters and the same tokens:
#   scripts/compare_pytorch.sh bench_small|bench_medium [STEPS]
# For 1 and 2 threads: `lockstep bench` (fast mode, fp32) and the PyTorch rebuild of the model
# (scripts/compare_pytorch.py) run the same warm-up + STEPS (default 10) steps one after the other;
# the script prints each side's tokens/s (median step) and their ratio, and which BLAS kernel each
# side ran. Then the step-1 losses of Lockstep (fast and canonical) and PyTorch are checked against
# the fp64 loss within a first-order bound derived from the operands (compare_pytorch.py, bound_step1);
# exit 1 if a check fails.
#
# PyTorch at its best on this CPU: these machines set OPENBLAS_CORETYPE=Haswell (AVX2 kernels).
# Here only, OpenBLAS is pinned to SkylakeX (AVX-512) when the CPU has avx512f, for both sides, and
# PyTorch also runs on Debian's OpenMP build of OpenBLAS (libopenblas0-openmp, through
# LD_LIBRARY_PATH; the system default is untouched) when that is installed; the faster PyTorch
# variant is the one compared. Tests and CI never change OPENBLAS_CORETYPE.
# Env: LOCKSTEP (the binary, default build/bin/lockstep), COMPARE_THREADS (default "1 2").
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
name="${1:-}"
steps="${2:-10}"
case "$name" in
  bench_small | bench_medium) ;;
  *) echo "usage: scripts/compare_pytorch.sh bench_small|bench_medium [STEPS]" >&2; exit 2 ;;
esac
config="$root/scripts/configs/$name.toml"
lockstep="${LOCKSTEP:-$root/build/bin/lockstep}"
[ -x "$lockstep" ] || { echo "compare_pytorch: $lockstep not found; build first (scripts/build.sh) or set LOCKSTEP" >&2; exit 2; }
py=/usr/bin/python3  # Debian's python, where python3-torch and python3-numpy live
if ! "$py" -c "import torch, numpy" 2>/dev/null; then
  echo "compare_pytorch: $py cannot import torch; installing with scripts/setup.sh"
  "$root/scripts/setup.sh"
fi

if grep -q -w avx512f /proc/cpuinfo; then core=SkylakeX; else core=Haswell; fi
omp_dir=/usr/lib/x86_64-linux-gnu/openblas-openmp
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
warmup=2
batch="$(sed -n 's/^batch_size *= *\([0-9]*\).*/\1/p' "$config")"

echo "compare_pytorch: $name, $warmup warm-up + $steps timed steps, OPENBLAS_CORETYPE=$core here (machine: ${OPENBLAS_CORETYPE:-unset}); load: $(cut -d' ' -f1-3 /proc/loadavg)"
"$lockstep" ckpt export --config "$config" "$work/init.safetensors" >/dev/null

field() {  # field FILE KEY: a top-level JSON value
  "$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}
py_common=(--weights "$work/init.safetensors" --tokens "$work/tokens.bin" --lockstep-json "$work/ls.json" --batch "$batch")

fail=0
for t in ${COMPARE_THREADS:-1 2}; do
  export OPENBLAS_CORETYPE=$core OMP_NUM_THREADS=$t OPENBLAS_NUM_THREADS=$t
  "$lockstep" bench --config "$config" --train.mode=fast --train.threads="$t" --bench.warmup=$warmup \
    --bench.steps="$steps" --json "$work/ls.json" --tokens-out "$work/tokens.bin" >"$work/ls.txt"
  ls_tps="$(field "$work/ls.json" tokens_per_s)"
  best_tps=0 best=""
  for variant in pthread openmp; do
    lib=()
    if [ "$variant" = openmp ]; then
      [ -e "$omp_dir/libblas.so.3" ] || { echo "  (PyTorch on OpenMP OpenBLAS: not installed; apt-get install libopenblas0-openmp)"; continue; }
      lib=(env "LD_LIBRARY_PATH=$omp_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
    fi
    "${lib[@]}" "$py" "$root/scripts/compare_pytorch.py" time "${py_common[@]}" --threads "$t" --warmup $warmup \
      >"$work/pt_$variant.json"
    tps="$(field "$work/pt_$variant.json" tokens_per_s)"
    echo "  threads $t: PyTorch $(field "$work/pt_$variant.json" torch) on $variant OpenBLAS ($(field "$work/pt_$variant.json" openblas_core)): $(printf %.0f "$tps") tokens/s"
    if "$py" -c "import sys; sys.exit(not float(sys.argv[1]) > float(sys.argv[2]))" "$tps" "$best_tps"; then
      best_tps=$tps best=$variant
    fi
  done
  cp "$work/pt_$best.json" "$work/pt_$t.json"
  cp "$work/ls.json" "$work/ls_$t.json"
  "$py" - "$ls_tps" "$best_tps" "$t" "$(field "$work/ls.json" openblas_core)" "$best" "$(field "$work/pt_$best.json" openblas_core)" <<'EOF'
import sys
ls, pt, t, ls_core, variant, pt_core = float(sys.argv[1]), float(sys.argv[2]), *sys.argv[3:]
print(f"threads {t}: Lockstep fast {ls:.0f} tokens/s (OpenBLAS {ls_core}), PyTorch {pt:.0f} tokens/s "
      f"({variant} OpenBLAS {pt_core}); Lockstep / PyTorch = {ls / pt:.3f}")
EOF
done

# Step-1 losses against the fp64 loss (the tokens and learning rates are the same at every thread count).
first_t="$(echo ${COMPARE_THREADS:-1 2} | cut -d' ' -f1)"
"$lockstep" bench --config "$config" --train.mode=canonical --train.threads=1 --bench.warmup=0 --bench.steps=1 \
  --json "$work/canon.json" >/dev/null
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
