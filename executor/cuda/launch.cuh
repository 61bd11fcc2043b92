// One spelling of a kernel launch for nvcc and for the CPU test double of the CUDA runtime
// (executor/cuda/emulated/): CTX_LAUNCH(grid, block, smem_bytes, stream, kernel)(args...).
// Under nvcc it is kernel<<<grid, block, smem_bytes, stream>>>(args...). In the emulated build
// (CTX_CUDA_EMULATED, the launchers compiled as C++) it queues the kernel, with its arguments
// copied as a real launch copies them, on the emulated stream; the emulator runs it there with its
// launch-limit, barrier and race checks (docs/CUDA.md).
#pragma once
#if defined(CTX_CUDA_EMULATED)
#include "executor/cuda/emulated/emu_launch.hpp"
#define CTX_LAUNCH(grid, block, smem, stream, ...) \
  ::ctx_emu::Launch(#__VA_ARGS__, (grid), (block), (smem), (stream), __VA_ARGS__)
#else
#define CTX_LAUNCH(grid, block, smem, stream, ...) __VA_ARGS__<<<(grid), (block), (smem), (stream)>>>
#endif
