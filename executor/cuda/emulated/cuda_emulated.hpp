// --backend cuda-emulated: the CUDA backend's own host code (cuda_backend.cpp, the caching
// allocator, gemm_lt.cpp, comm_nccl.cpp) and kernel source (*_kernels.cuh through the launchers)
// linked against CPU test doubles of the CUDA runtime, cuBLASLt and NCCL (emu_*.cpp), the kernels
// running on the CUDA execution-model emulator. Plain C++: ctxrun_main.cpp includes it.
//
// What it proves and what it cannot: docs/CUDA.md ("The emulated backend").
#pragma once
#include <memory>

#include "executor/backend.hpp"
#include "executor/cuda/cuda_backend.hpp"  // CudaBackendOptions

namespace ctx::exec {

// The emulated device is one per process (device 0); its capacity is CTX_EMU_DEVICE_MIB.
std::unique_ptr<Backend> make_cuda_emulated_backend(int device, const CudaBackendOptions& options = {});

}  // namespace ctx::exec
