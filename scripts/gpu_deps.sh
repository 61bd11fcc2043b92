#!/usr/bin/env bash
# gpu_deps.sh [DIR] -- unpacks the Debian packages the build needs beyond a CUDA toolkit (headers,
# CMake configs, static GoogleTest) into DIR (default .deps/, ignored by git), so the tree builds
# on a bare GPU machine that has nvcc, CMake and PyTorch but no -dev packages and no network.
# Run it here, where apt reaches Debian; send DIR with the tree (device tool: carry [".deps"]);
# scripts/gpu_proof.sh finds it. MPI is left out: the GPU proof runs one rank without it.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.deps}
pkgs=(nlohmann-json3-dev libeigen3-dev libcli11-dev libgtest-dev libgmock-dev)
command -v apt-get > /dev/null || { echo "gpu_deps: apt-get not found: run this on a Debian machine" >&2; exit 2; }
dl=$(mktemp -d)
trap 'rm -rf "$dl"' EXIT
if ! (cd "$dl" && apt-get download "${pkgs[@]}" > /dev/null 2>&1); then
  [ "$(id -u)" -eq 0 ] && apt-get update -qq > /dev/null 2>&1 || true
  (cd "$dl" && apt-get download "${pkgs[@]}") || { echo "gpu_deps: apt-get download failed for ${pkgs[*]}" >&2; exit 2; }
fi
rm -rf "$dir"
mkdir -p "$dir"
for deb in "$dl"/*.deb; do dpkg -x "$deb" "$dir"; done
rm -rf "$dir/usr/share/doc" "$dir/usr/share/man" "$dir/usr/src"
printf '%s\n' "${pkgs[@]}" > "$dir/PACKAGES"
echo "gpu_deps: ${#pkgs[@]} packages into $dir ($(du -sh "$dir" | cut -f1)): ${pkgs[*]}"
