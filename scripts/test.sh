#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite with ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh python3-torch  # the PyTorch comparison test needs it; training does not
scripts/build.sh
# Multi-rank tests use mpirun; as root Open MPI needs an explicit opt-in.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd build
ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "$@"
