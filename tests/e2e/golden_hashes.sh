#!/usr/bin/env bash
# Canonical model hashes of every model option (tests/golden/canonical_hashes.txt) are the pinned
# ones: a refactoring that moves a bit of any variant fails here, whatever layout tests compare.
source "$(dirname "$0")/lib.sh"
"$SRC/scripts/golden_hashes.sh" "$LOCKSTEP"
