#!/usr/bin/env bash
# Configures and builds ctxplan into build/ (Release). Optional parts (MPI executor, CUDA
# backend, GUI) switch on by themselves where their dependencies are installed.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j"$jobs"
