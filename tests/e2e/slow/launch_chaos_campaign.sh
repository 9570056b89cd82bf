#!/usr/bin/env bash
# The chaos campaign (the label `slow`): 20 kills per layout at random steps and ranks, half of
# them during asynchronous saves. The default suite runs 2 per layout (one with each kind of save).
set -euo pipefail
export LS_E2E_FULL=1
bash "$(dirname "$0")/../launch_chaos.sh" "$1" "$2" "$3"
