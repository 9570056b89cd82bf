#!/usr/bin/env bash
# Mutation check: proof that the kernel tests bite (issue 3, part 6).
#
# Copies the committed tree (git archive HEAD; --worktree: the tracked files as they are now) into
# a temporary directory, builds test_property and the kernel unit-test binaries once (Release,
# LOCKSTEP_CUDA=OFF, -j2), checks that they pass unmutated, then for every scripts/mutants/*.patch:
# applies it, rebuilds (only the touched kernel files recompile), runs every binary, records which
# tests failed, and reverts the patch. A mutant is caught when at least one test fails.
# Prints one row per mutant and "N/M mutants caught"; exits 1 if any mutant survived, 2 if the
# unmutated tree does not build or pass (then no mutant result would mean anything).
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
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
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

binaries=(test_property test_unit_kernels test_unit_kernels_attention test_unit_kernels_elementwise)
export RC_PARAMS="${RC_PARAMS:-noshrink=1}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

build_all() {
  cmake --build "$build" -j"$jobs" --target "${binaries[@]}" >"$1" 2>&1
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

mutants=()
if [[ ${#selected[@]} -gt 0 ]]; then
  for m in "${selected[@]}"; do mutants+=("$root/scripts/mutants/$m.patch"); done
else
  mutants=("$root"/scripts/mutants/*.patch)
fi

caught=0
total=0
table=()
for patch in "${mutants[@]}"; do
  name="$(basename "$patch" .patch)"
  total=$((total + 1))
  if ! (cd "$src" && patch -p1 -s --forward <"$patch"); then
    table+=("$(printf '%-40s %s' "$name" "PATCH DOES NOT APPLY (counted as survived)")")
    continue
  fi
  start=$(date +%s)
  if ! build_all "$logs/build.$name.log"; then
    verdict="BUILD FAILED (counted as survived): $logs/build.$name.log"
  elif run_all "$logs/run.$name"; then
    verdict="SURVIVED"
  else
    caught=$((caught + 1))
    verdict="caught by $(tr '\n' ' ' <"$logs/run.$name.failed")"
  fi
  (cd "$src" && patch -p1 -s -R <"$patch")
  row="$(printf '%-40s %4ss  %s' "$name" "$(($(date +%s) - start))" "$verdict")"
  echo "$row"
  table+=("$row")
done

echo
echo "mutant                                   time  result"
printf '%s\n' "${table[@]}"
echo "$caught/$total mutants caught"
if [[ -n "${LS_MUTATION_DIR:-}" || $keep -eq 1 ]]; then echo "logs: $logs"; fi
[[ $caught -eq $total ]]
