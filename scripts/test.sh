#!/usr/bin/env bash
# Runs the whole test suite (tests that need a GPU report SKIPPED without one).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d build ] || bash scripts/build.sh
ctest --test-dir build --output-on-failure -j"$(nproc 2>/dev/null || echo 2)"
