#!/usr/bin/env bash
# `lockstep verify step` passes in every setup of tests/verify_setups.txt (every model option in
# both modes, both clipping branches, decay on each class), each step in its row's branch.
source "$(dirname "$0")/lib.sh"
"$SRC/scripts/verify_setups.sh" --cli "$LOCKSTEP" --work "$WORK/setups" > setups.log 2>&1 \
  || fail "verify setups: $(grep -E 'FAIL|error' setups.log | head -5)"
grep -q "^verify setups: \([0-9]*\)/\1 pass" setups.log || fail "no closing count: $(tail -2 setups.log)"
