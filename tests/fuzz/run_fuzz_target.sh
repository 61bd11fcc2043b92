#!/usr/bin/env bash
# Runs one libFuzzer target (docs/FUZZING.md):
#   run_fuzz_target.sh BIN SECONDS SEED_DIR DICT REGRESSION_DIR ARTIFACT_DIR [CORPUS_DIR]
# First every kept regression input (tests/fuzz/regressions/<target>/) runs once and must pass;
# then the target fuzzes for SECONDS from the seeds (new inputs go to CORPUS_DIR, a scratch folder
# when not given). A crash, sanitizer report, uncaught exception, timeout (10 s per input) or
# memory blow-up (2 GB) fails the run and leaves the input in ARTIFACT_DIR.
set -euo pipefail
bin=$1 secs=$2 seeds=$3 dict=$4 reg=$5 artifacts=$6 corpus=${7:-}
mkdir -p "$artifacts"
shopt -s nullglob
kept=("$reg"/*)
if [ ${#kept[@]} -gt 0 ]; then
  echo "== $(basename "$bin"): ${#kept[@]} regression inputs"
  "$bin" -timeout=10 -rss_limit_mb=2048 "${kept[@]}"
fi
scratch=$corpus
if [ -z "$scratch" ]; then
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
fi
mkdir -p "$scratch"
args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1
      -artifact_prefix="$artifacts/")
[ -f "$dict" ] && args+=(-dict="$dict")
echo "== $(basename "$bin"): fuzzing for $secs s"
"$bin" "${args[@]}" "$scratch" "$seeds"
