#!/usr/bin/env bash
# libFuzzer targets of tests/fuzz (docs/FUZZING.md), in their own clang build (build-fuzz/ by default;
# FUZZ_BUILD_DIR overrides). Skips cleanly (exit 0) where no clang with libFuzzer is installed.
#   bash scripts/fuzz.sh build                        configure and build the targets
#   bash scripts/fuzz.sh smoke [SECONDS]              every target SECONDS (default 5), regressions first
#   bash scripts/fuzz.sh campaign SECONDS [TARGET...] long runs, one target after another; the corpus
#                                                     grows in <build>/corpus/<target>, findings land in
#                                                     <build>/findings/<target>/ (copy each into
#                                                     tests/fuzz/regressions/<target>/ once fixed)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FUZZ_BUILD_DIR:-build-fuzz}
targets_all=(fuzz_json_loaders fuzz_plan_string fuzz_compare fuzz_safetensors fuzz_token_file)
dict_of() {
  case $1 in
    fuzz_json_loaders) echo tests/fuzz/dict/json_loaders.dict ;;
    fuzz_plan_string) echo tests/fuzz/dict/plan_string.dict ;;
    fuzz_compare) echo tests/fuzz/dict/compare.dict ;;
    fuzz_safetensors) echo tests/fuzz/dict/safetensors.dict ;;
    *) echo "" ;;
  esac
}

find_clang() {
  for c in clang++-16 clang++-15 clang++-14 clang++; do
    command -v "$c" >/dev/null 2>&1 || continue
    probe=$(mktemp -d)
    printf '#include <cstdint>\n#include <cstddef>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' > "$probe/p.cpp"
    if "$c" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" >/dev/null 2>&1; then
      rm -rf "$probe"; command -v "$c"; return 0
    fi
    rm -rf "$probe"
  done
  return 1
}

do_build() {
  if ! cxx=$(find_clang); then
    echo "fuzz: no clang with libFuzzer (apt-get install clang libclang-rt-dev): fuzz targets skipped"
    exit 0
  fi
  # an existing fuzz build keeps its compiler (naming another spelling of it would reset the cache)
  if grep -q '^CTXPLAN_FUZZ:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
    cmake -S . -B "$build" >/dev/null
  else
    cmake -S . -B "$build" -DCMAKE_CXX_COMPILER="$cxx" -DCTXPLAN_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  fi
  cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)" --target "${targets_all[@]}"
}

run_one() {  # target seconds [corpus]
  local t=$1 secs=$2 corpus=${3:-}
  bash tests/fuzz/run_fuzz_target.sh "$build/tests/fuzz/$t" "$secs" "$build/tests/fuzz/seeds/$t" "$(dict_of "$t")" \
    "tests/fuzz/regressions/$t" "$build/findings/$t" $corpus
}

cmd=${1:-smoke}
case $cmd in
  build) do_build ;;
  smoke)
    do_build
    for t in "${targets_all[@]}"; do run_one "$t" "${2:-5}"; done ;;
  campaign)
    secs=${2:?campaign SECONDS [TARGET...]}
    shift 2 || true
    do_build
    targets=("$@")
    [ ${#targets[@]} -eq 0 ] && targets=("${targets_all[@]}")
    for t in "${targets[@]}"; do
      mkdir -p "$build/corpus/$t"
      run_one "$t" "$secs" "$build/corpus/$t" 2>&1 | tee "$build/findings-$t.log" || echo "fuzz: $t stopped on a finding (see $build/findings/$t)"
    done ;;
  *) echo "usage: scripts/fuzz.sh build | smoke [SECONDS] | campaign SECONDS [TARGET...]" >&2; exit 2 ;;
esac
