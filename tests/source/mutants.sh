#!/usr/bin/env bash
# Every planted bug of scripts/mutants/ applies to the tree exactly (no fuzz) where
# scripts/mutation_check.sh applies it (patch -p1 --forward): code that moves under a mutant must
# take its patch along, or the mutation check counts that mutant as survived without building it.
#   mutants.sh SOURCE_DIR
set -u
cd "$1"
command -v patch > /dev/null || { echo "mutants: no patch(1) to apply scripts/mutants/ with (build-essential brings it)" >&2; exit 1; }
status=0
count=0
for p in scripts/mutants/*.patch; do
  count=$((count + 1))
  if ! patch -p1 --forward --dry-run --fuzz=0 --silent < "$p" > /dev/null 2>&1; then
    echo "mutants: $p does not apply to the tree" >&2
    status=1
  fi
done
[ "$status" -eq 0 ] && echo "mutants: all $count patches apply"
exit "$status"
