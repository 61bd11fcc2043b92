// Force-included (-include) into every source of the emulated CUDA backend (CMakeLists.txt here):
//  1. renames each CUDA runtime, cuBLASLt and NCCL function the test doubles implement to
//     ctxemu_<name>, before any CUDA header declares it, so the doubles (emu_*.cpp) and the real
//     libraries link into one program (ctxrun has both --backend cuda and cuda-emulated); a
//     function the backend starts to call that has no double fails to link, naming ctxemu_<name>;
//  2. maps the CUDA spellings of device code onto the CPU emulator (cuda_emulator.hpp), so the
//     kernel source and the launchers (*.cu, compiled here as C++) run on it.
// The C++ names are renamed by -Dcuda=cuda_emu (namespace ctx::exec::cuda -> ctx::exec::cuda_emu).
#pragma once
#define CTX_CUDA_EMULATED 1
// the backend's public functions (namespace ctx::exec) get the emulated names that
// cuda_emulated.hpp declares
#define make_cuda_backend make_cuda_emulated_backend
#define cuda_device_count cuda_emulated_device_count
#define cuda_device_for_local_rank cuda_emulated_device_for_local_rank
#define cuda_backend_stream cuda_emulated_backend_stream
#define cuda_backend_synchronize cuda_emulated_backend_synchronize
#define cuda_memory_report cuda_emulated_memory_report
#define CudaMemoryReport CudaEmulatedMemoryReport
#define make_nccl_comm make_emulated_nccl_comm
#define cublasLtCreate ctxemu_cublasLtCreate
#define cublasLtDestroy ctxemu_cublasLtDestroy
#define cublasLtGetStatusName ctxemu_cublasLtGetStatusName
#define cublasLtGetStatusString ctxemu_cublasLtGetStatusString
#define cublasLtMatmul ctxemu_cublasLtMatmul
#define cublasLtMatmulAlgoGetHeuristic ctxemu_cublasLtMatmulAlgoGetHeuristic
#define cublasLtMatmulDescCreate ctxemu_cublasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy ctxemu_cublasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute ctxemu_cublasLtMatmulDescSetAttribute
#define cublasLtMatmulPreferenceCreate ctxemu_cublasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy ctxemu_cublasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute ctxemu_cublasLtMatmulPreferenceSetAttribute
#define cublasLtMatrixLayoutCreate ctxemu_cublasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy ctxemu_cublasLtMatrixLayoutDestroy
#define cublasLtMatrixLayoutSetAttribute ctxemu_cublasLtMatrixLayoutSetAttribute
#define cudaDeviceGetAttribute ctxemu_cudaDeviceGetAttribute
#define cudaDeviceGetStreamPriorityRange ctxemu_cudaDeviceGetStreamPriorityRange
#define cudaDeviceSynchronize ctxemu_cudaDeviceSynchronize
#define cudaDriverGetVersion ctxemu_cudaDriverGetVersion
#define cudaEventCreate ctxemu_cudaEventCreate
#define cudaEventCreateWithFlags ctxemu_cudaEventCreateWithFlags
#define cudaEventDestroy ctxemu_cudaEventDestroy
#define cudaEventElapsedTime ctxemu_cudaEventElapsedTime
#define cudaEventQuery ctxemu_cudaEventQuery
#define cudaEventRecord ctxemu_cudaEventRecord
#define cudaEventSynchronize ctxemu_cudaEventSynchronize
#define cudaFree ctxemu_cudaFree
#define cudaFreeHost ctxemu_cudaFreeHost
#define cudaFuncSetAttribute ctxemu_cudaFuncSetAttribute
#define cudaGetDevice ctxemu_cudaGetDevice
#define cudaGetDeviceCount ctxemu_cudaGetDeviceCount
#define cudaGetDeviceProperties ctxemu_cudaGetDeviceProperties
#define cudaGetErrorName ctxemu_cudaGetErrorName
#define cudaGetErrorString ctxemu_cudaGetErrorString
#define cudaGetLastError ctxemu_cudaGetLastError
#define cudaHostAlloc ctxemu_cudaHostAlloc
#define cudaLaunchHostFunc ctxemu_cudaLaunchHostFunc
#define cudaMalloc ctxemu_cudaMalloc
#define cudaMallocHost ctxemu_cudaMallocHost
#define cudaMallocManaged ctxemu_cudaMallocManaged
#define cudaMemAdvise ctxemu_cudaMemAdvise
#define cudaMemGetInfo ctxemu_cudaMemGetInfo
#define cudaMemPrefetchAsync ctxemu_cudaMemPrefetchAsync
#define cudaMemcpy ctxemu_cudaMemcpy
#define cudaMemcpy2DAsync ctxemu_cudaMemcpy2DAsync
#define cudaMemcpyAsync ctxemu_cudaMemcpyAsync
#define cudaMemset ctxemu_cudaMemset
#define cudaMemsetAsync ctxemu_cudaMemsetAsync
#define cudaPeekAtLastError ctxemu_cudaPeekAtLastError
#define cudaPointerGetAttributes ctxemu_cudaPointerGetAttributes
#define cudaRuntimeGetVersion ctxemu_cudaRuntimeGetVersion
#define cudaSetDevice ctxemu_cudaSetDevice
#define cudaStreamCreate ctxemu_cudaStreamCreate
#define cudaStreamCreateWithFlags ctxemu_cudaStreamCreateWithFlags
#define cudaStreamCreateWithPriority ctxemu_cudaStreamCreateWithPriority
#define cudaStreamDestroy ctxemu_cudaStreamDestroy
#define cudaStreamGetPriority ctxemu_cudaStreamGetPriority
#define cudaStreamQuery ctxemu_cudaStreamQuery
#define cudaStreamSynchronize ctxemu_cudaStreamSynchronize
#define cudaStreamWaitEvent ctxemu_cudaStreamWaitEvent
#define ncclAllGather ctxemu_ncclAllGather
#define ncclAllReduce ctxemu_ncclAllReduce
#define ncclAlltoAll ctxemu_ncclAlltoAll
#define ncclBroadcast ctxemu_ncclBroadcast
#define ncclCommAbort ctxemu_ncclCommAbort
#define ncclCommCount ctxemu_ncclCommCount
#define ncclCommDestroy ctxemu_ncclCommDestroy
#define ncclCommFinalize ctxemu_ncclCommFinalize
#define ncclCommGetAsyncError ctxemu_ncclCommGetAsyncError
#define ncclCommInitRank ctxemu_ncclCommInitRank
#define ncclCommInitRankConfig ctxemu_ncclCommInitRankConfig
#define ncclCommUserRank ctxemu_ncclCommUserRank
#define ncclGetErrorString ctxemu_ncclGetErrorString
#define ncclGetLastError ctxemu_ncclGetLastError
#define ncclGetUniqueId ctxemu_ncclGetUniqueId
#define ncclGetVersion ctxemu_ncclGetVersion
#define ncclGroupEnd ctxemu_ncclGroupEnd
#define ncclGroupStart ctxemu_ncclGroupStart
#define ncclRecv ctxemu_ncclRecv
#define ncclReduceScatter ctxemu_ncclReduceScatter
#define ncclSend ctxemu_ncclSend

#include <cuda_runtime_api.h>
#include <cublasLt.h>
#include <nccl.h>

#include "executor/cuda/tests/cuda_emulator.hpp"
#include "executor/cuda/tests/mma_emulator.hpp"

// cuda_runtime.h's C++ overload, which takes the kernel itself (device code passes kernels, not
// void pointers; cuda_runtime.h cannot be included in the emulated build)
template <class T>
inline cudaError_t cudaFuncSetAttribute(T* entry, enum cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}
