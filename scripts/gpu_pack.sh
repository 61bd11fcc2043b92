#!/usr/bin/env bash
# gpu_pack.sh -- builds here what scripts/gpu_session.sh runs on the GPU machine (CUDA on, MPI and GUI
# off, sm_90) into build-gpu/, strips the binaries and packs them into build-gpubin/bin.tar.xz
# (about 10 MB; carried by the device tool, which takes 64 MiB with the tree).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCTXPLAN_WITH_CUDA=ON -DCTXPLAN_WITH_MPI=OFF -DCTXPLAN_WITH_GUI=OFF \
  -DCTXPLAN_BUILD_BENCH=OFF ${CMAKE_EXTRA:-} > /dev/null
targets=(ctxrun ctxrun-calibrate test_cuda_kernels test_backend_ops_gpu backend_ops test_attention_cudnn)
cmake --build build-gpu -j"${JOBS:-2}" --target "${targets[@]}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for t in executor/ctxrun executor/cuda/ctxrun-calibrate executor/cuda/tests/test_cuda_kernels \
         executor/tests/test_backend_ops_gpu executor/tests/backend_ops executor/cuda/tests/test_attention_cudnn; do
  cp "build-gpu/$t" "$tmp/"
done
strip "$tmp"/*
mkdir -p build-gpubin
tar -C "$tmp" -cJf build-gpubin/bin.tar.xz .
git rev-parse HEAD > build-gpubin/COMMIT
echo "gpu_pack: build-gpubin/bin.tar.xz ($(du -h build-gpubin/bin.tar.xz | cut -f1)) from $(cat build-gpubin/COMMIT)"
