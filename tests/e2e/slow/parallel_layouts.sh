#!/usr/bin/env bash
# The parallel-layout scripts' full campaign (the label `slow`): every layout, MoE variant and fast
# mode comparison that context_parallel.sh, expert_parallel.sh, pipeline_canonical.sh,
# pipeline_zero_bubble.sh and plan_validate.sh hold. The default suite runs a layout of each kind.
set -euo pipefail
export LS_E2E_FULL=1
here=$(dirname "$0")
for name in context_parallel expert_parallel pipeline_canonical pipeline_zero_bubble plan_validate; do
  bash "$here/../$name.sh" "$1" "$2/$name" "$3"
done
echo "parallel layouts, full campaign: OK"
