#!/usr/bin/env bash
# Installs the Debian packages ctxplan needs. Safe to re-run: apt-get skips what is present.
# Core (costmodel, planner, tests): compiler, CMake, nlohmann/json, Eigen, GoogleTest, CLI11,
# toml++ and yaml-cpp (ctxplan import/export of torchtitan TOML and ArcticTraining YAML).
# Optional parts: OpenMPI (executor under mpirun), GLFW + imgui + GL + Xvfb (ctxplan-gui),
# clang + its runtime (the libFuzzer targets of tests/fuzz, docs/FUZZING.md).
# The CUDA toolkit (nvcc, cuBLAS, cuDNN, NCCL) is expected at /usr/local/cuda and is not installed here.
set -euo pipefail
pkgs=(build-essential cmake pkg-config
      nlohmann-json3-dev libeigen3-dev libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev
      libtomlplusplus-dev libyaml-cpp-dev
      libopenmpi-dev openmpi-bin
      libglfw3-dev libimgui-dev libstb-dev libgl-dev libgl1-mesa-dri xvfb xauth
      clang libclang-rt-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#pkgs[@]} packages already installed"
  exit 0
fi
echo "setup: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
