#!/usr/bin/env bash
# The fp8 scripts' full campaign (the label `slow`): every scaling recipe's hash on two threads
# with AVX2 and under dp2 x tp2 with sequence parallelism, and the Hopper accumulator's blockwise
# recipe as well as its delayed one. The default suite runs one recipe of each.
set -euo pipefail
export LS_E2E_FULL=1
here=$(dirname "$0")
bash "$here/../train_fp8.sh" "$1" "$2/fp8" "$3"
bash "$here/../train_fp8_hopper.sh" "$1" "$2/hopper" "$3"
echo "fp8 recipes, full campaign: OK"
