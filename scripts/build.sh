#!/usr/bin/env bash
# Configures and builds Lockstep into build/ (Release). CUDA targets are built when nvcc exists.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j "$jobs"
