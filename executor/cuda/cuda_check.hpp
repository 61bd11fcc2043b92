// Error checks for the CUDA runtime and cuBLASLt: a failed call throws std::runtime_error naming
// the call, the file:line and the library's own error string, so a bad launch or an out-of-memory
// is reported where it happened instead of surfacing later as a wrong number.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace ctx::exec::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " +
                           what + " at " + file + ":" + std::to_string(line));
}

[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("cuBLASLt error ") + cublasLtGetStatusName(s) + " (" +
                           cublasLtGetStatusString(s) + ") in " + what + " at " + file + ":" + std::to_string(line));
}

}  // namespace ctx::exec::cuda

#define CTX_CUDA(call)                                                               \
  do {                                                                               \
    cudaError_t ctx_e_ = (call);                                                     \
    if (ctx_e_ != cudaSuccess) ::ctx::exec::cuda::throw_cuda(ctx_e_, #call, __FILE__, __LINE__); \
  } while (0)

#define CTX_CUBLAS(call)                                                             \
  do {                                                                               \
    cublasStatus_t ctx_s_ = (call);                                                  \
    if (ctx_s_ != CUBLAS_STATUS_SUCCESS) ::ctx::exec::cuda::throw_cublas(ctx_s_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad configuration is reported by the launch itself.
#define CTX_CUDA_LAUNCHED(name) CTX_CUDA(cudaGetLastError())
