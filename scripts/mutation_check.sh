#!/usr/bin/env bash
# Mutation check: proof that the test suite and `lockstep verify step` bite.
#
# Copies the committed tree (git archive HEAD; --worktree: the tracked and new files as they are
# now) into a work directory, builds all of it (Release, LOCKSTEP_CUDA=OFF), and requires the
# unmutated tree to pass the whole default ctest suite and `verify step` in every setup of
# tests/verify_setups.txt (scripts/verify_setups.sh; the setups' checkpoints are trained once, by
# the unmutated CLI). Then for every scripts/mutants/*.patch (or the NAMEs given) it:
#  1. applies the patch and rebuilds incrementally;
#  2. derives the tests that run the mutated code: every test whose command runs a binary the
#     rebuild relinked (test binaries, mpirun of them, e2e scripts of the lockstep CLI);
#  3. runs them stage by stage, cheap first (labels unit, property, mpi, bench, e2e), each with
#     ctest --stop-on-failure, and stops at the first stage with a failure: caught by the tests,
#     naming the failed tests;
#  4. runs the mutant CLI's `verify step` in the setups until one fails: caught by verify step in
#     that setup (naming the worst tensor);
#  5. reverts the patch.
# A patch's header (before the diff) says the bug it plants ("Planted bug: ..."); a line
# "Verify-step: not applicable: REASON" marks a bug that model data in one process cannot reach
# (a fallback only adversarial operands take, a collective, a multi-rank layout): only the tests
# must catch it, and its row says why verify step was not run.
# Prints one row per mutant with both verdicts, "N/M mutants caught by the tests" and "N/M caught
# by verify step"; exits 1 if any mutant escaped either, 2 if the unmutated tree does not build or
# pass (then no mutant result would mean anything).
#
# Usage: scripts/mutation_check.sh [--worktree] [--keep] [--jobs N] [mutant-name ...]
# Environment: LS_MUTATION_DIR (work dir, default a mktemp dir, removed after), RC_PARAMS (default
# noshrink=1: a caught mutant needs one counterexample, not a minimal one).
# Not part of the default ctest run: it is the `mutation` label, enabled by -DLS_MUTATION_TESTS=ON.
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
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
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
  (cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -c) | tar -x -C "$src"
fi
echo "mutation check: tree from $source_mode in $src"
started=$(date +%s)

export RC_PARAMS="${RC_PARAMS:-noshrink=1}"
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
stages=(unit property mpi bench e2e)

# stage_tests LABEL: the numbers of the tests with that label.
stage_tests() { (cd "$build" && ctest -N -L "^$1\$") | sed -nE 's/^ *Test +#([0-9]+):.*/\1/p'; }

# affected_tests: numbers of the tests whose command names a binary listed in $work/relinked.
affected_tests() {
  (cd "$build" && ctest -N -V) | sed -nE 's/^([0-9]+): Test command: (.*)/\1 \2/p' |
    while read -r number command; do
      while read -r binary; do
        if [[ -n "$binary" && "$command " == *"$binary"[\"\ ]* ]]; then echo "$number"; break; fi
      done <"$work/relinked"
    done
}

# run_stages NAME TESTS...: runs the given tests stage by stage until one fails; writes the failed
# tests' names to $logs/run.NAME.failed and returns 1 if any failed.
run_stages() {
  local name="$1" stage ids
  shift
  local -A wanted=()
  for t in "$@"; do wanted[$t]=1; done
  : >"$logs/run.$name.failed"
  for stage in "${stages[@]}"; do
    ids=()
    for t in $(stage_tests "$stage"); do [[ -n "${wanted[$t]:-}" ]] && ids+=("$t"); done
    [[ ${#ids[@]} -eq 0 ]] && continue
    local list
    list="$(IFS=,; echo "${ids[*]}")"
    if ! (cd "$build" && ctest -j"$jobs" --stop-on-failure -I "0,0,0,$list") >"$logs/run.$name.$stage.log" 2>&1; then
      awk '/tests FAILED:/ { on = 1; next } on && /^[[:space:]]*[0-9]+ - / { sub(/^[[:space:]]*[0-9]+ - /, ""); sub(/ \(Failed\)$/, ""); print; next }
           on { on = 0 }' "$logs/run.$name.$stage.log" >"$logs/run.$name.failed"
      [[ -s "$logs/run.$name.failed" ]] || echo "($stage stage failed: $logs/run.$name.$stage.log)" >"$logs/run.$name.failed"
      return 1
    fi
  done
  return 0
}

cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=OFF >"$logs/configure.log" 2>&1 ||
  { echo "configure failed: $logs/configure.log"; keep=1; exit 2; }
echo "building the tree (unmutated)"
cmake --build "$build" -j"$jobs" >"$logs/build.baseline.log" 2>&1 ||
  { echo "baseline build failed: $logs/build.baseline.log"; keep=1; exit 2; }
echo "built in $(($(date +%s) - started)) s; running the whole suite (unmutated)"
if ! (cd "$build" && ctest -j"$jobs") >"$logs/run.baseline.log" 2>&1; then
  echo "the unmutated tree fails its own tests; fix that first:"
  grep -A30 'tests FAILED' "$logs/run.baseline.log" || tail -5 "$logs/run.baseline.log"
  keep=1
  exit 2
fi
echo "baseline: $(grep -E 'tests passed' "$logs/run.baseline.log")"

cli="$build/bin/lockstep"
verify_setups=("$src/scripts/verify_setups.sh" --work "$work/verify")
if ! "${verify_setups[@]}" --cli "$cli" --logs "$logs/verify.baseline" >"$logs/verify.baseline.log" 2>&1; then
  echo "the unmutated CLI fails verify step; fix that first:"
  grep -E 'FAIL|error' "$logs/verify.baseline.log"
  keep=1
  exit 2
fi
echo "baseline: $(tail -1 "$logs/verify.baseline.log") (at $(($(date +%s) - started)) s)"

mutants=()
if [[ ${#selected[@]} -gt 0 ]]; then
  for m in "${selected[@]}"; do mutants+=("$src/scripts/mutants/$m.patch"); done
else
  mutants=("$src"/scripts/mutants/*.patch)
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
    table+=("$(printf '%-44s %s' "$name" "PATCH DOES NOT APPLY (counted as survived by both)")")
    continue
  fi
  start=$(date +%s)
  touch "$work/stamp"
  if ! cmake --build "$build" -j"$jobs" >"$logs/build.$name.log" 2>&1; then
    verdict="BUILD FAILED (counted as survived by both): $logs/build.$name.log"
  else
    find "$build/bin" -maxdepth 1 -type f -newer "$work/stamp" >"$work/relinked"
    mapfile -t tests < <(affected_tests)
    if [[ ${#tests[@]} -eq 0 ]]; then
      verdict="tests: SURVIVED (no test runs a rebuilt binary)"
    elif run_stages "$name" "${tests[@]}"; then
      verdict="tests: SURVIVED (${#tests[@]} tests run)"
    else
      caught=$((caught + 1))
      verdict="tests: caught by $(head -3 "$logs/run.$name.failed" | tr '\n' ' ')"
      [[ $(wc -l <"$logs/run.$name.failed") -gt 3 ]] && verdict+="(+$(($(wc -l <"$logs/run.$name.failed") - 3)) more) "
    fi
    na_reason="$(sed -n 's/^Verify-step: not applicable: //p' "$patch" | head -1)"
    if [[ -n "$na_reason" ]]; then
      vna=$((vna + 1))
      verdict+="| verify step: not applicable ($na_reason)"
    elif "${verify_setups[@]}" --phase check --first-failure --cli "$cli" --logs "$logs/verify.$name" \
        >"$logs/verify.$name.log" 2>&1; then
      verdict+="| verify step: SURVIVED (every setup passes)"
    else
      vcaught=$((vcaught + 1))
      verdict+="| verify step: caught in $(grep -m1 ': FAIL' "$logs/verify.$name.log")"
    fi
  fi
  (cd "$src" && patch -p1 -s -R <"$patch")
  row="$(printf '%-44s %4ss  %s' "$name" "$(($(date +%s) - start))" "$verdict")"
  echo "$row"
  table+=("$row")
done
# Leave the build unmutated for a later run in the same directory.
cmake --build "$build" -j"$jobs" >"$logs/build.restore.log" 2>&1 || true

echo
echo "mutant                                       time  result"
printf '%s\n' "${table[@]}"
echo "$caught/$total mutants caught by the tests"
echo "$vcaught/$((total - vna)) mutants caught by verify step ($vna not applicable)"
echo "mutation check: $(($(date +%s) - started)) s"
if [[ -n "${LS_MUTATION_DIR:-}" || $keep -eq 1 ]]; then echo "logs: $logs"; fi
[[ $caught -eq $total && $((vcaught + vna)) -eq $total ]]
