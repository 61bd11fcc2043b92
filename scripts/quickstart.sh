#!/usr/bin/env bash
# The README's first command: install the Debian packages, build, and run the main job on its
# built-in defaults (Llama-3.1-8B at 128K tokens on one 8xH100 node, printed as a table).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/planner/ctxplan predict
