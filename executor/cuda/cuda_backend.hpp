// The CUDA backend: every Backend op on one CUDA stream of one device, GEMMs through cuBLASLt,
// attention as a flash-style kernel (attention.cu), a caching allocator under the unchanged
// ledger. Since issue 12 tensors are opaque and strategy code never touches their memory on the
// host, so device memory is plain cudaMalloc and no call waits for the device except download,
// synchronize and read_times. Storage is f32 or bf16 wherever the interface allows it
// (backend.hpp), with the CPU reference's bf16 semantics: bf16 widened on load, fp32 arithmetic,
// outputs rounded once to nearest even; GEMMs in bf16 on cuBLASLt with fp32 accumulation (issue 13).
//
// Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md): the gpu tests pass and ctxrun trains
// (docs/CUDA.md, "What ran on a GPU"); changes since are untested on GPU. The kernel source also runs on a
// CPU emulator in the tests.
//
// This header is plain C++ (no CUDA headers), so ctxrun_main.cpp can include it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "executor/backend.hpp"

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace ctx::exec {

struct CudaBackendOptions {
  // Device tensors in managed memory (host-readable) instead of cudaMalloc. For debugging, and for
  // a host-staged (MPI) communicator, which reads tensor memory on the host (host_address refuses
  // cudaMalloc memory, naming this option).
  bool managed_memory = false;
  // Synchronise the stream at the end of every Backend call: an error is then reported by the op
  // that caused it (debugging). Off: ops are queued, the host waits only in download,
  // synchronize and read_times.
  bool sync_each_call = false;
  // GEMMs on TF32 tensor cores instead of exact float32 FMA (faster, ~1e-3 relative error).
  bool tf32 = false;
  int64_t gemm_workspace_bytes = int64_t(32) << 20;  // cuBLASLt workspace, accounted as Mem::workspace
  // bf16 attention kernel: "auto" (tensor cores, attention_mma.cu, where the head dim allows; else
  // the SIMT kernel), "mma" (tensor cores or an error), "simt" (attention.cu). CTXPLAN_CUDA_ATTENTION
  // overrides it. fp32 inputs always run the SIMT kernel.
  std::string attention = "auto";
};

// Number of CUDA devices; 0 when there is none or no driver (the error is swallowed, the output
// initialised to 0 first, as cudaGetDeviceCount leaves it unchanged on failure).
int cuda_device_count();
// The device this process should use: its node-local rank (OMPI_COMM_WORLD_LOCAL_RANK,
// MPI_LOCALRANKID, SLURM_LOCALID or LOCAL_RANK) modulo the device count; 0 without those.
int cuda_device_for_local_rank();

// Throws std::runtime_error naming the reason when there is no usable device.
std::unique_ptr<Backend> make_cuda_backend(int device, const CudaBackendOptions& options = {});

// The backend's compute stream (nullptr when `be` is not a CUDA backend): the NCCL communicator
// orders its own stream against it with events.
CUstream_st* cuda_backend_stream(Backend& be);
// Blocks until every kernel the backend queued has finished (Backend::synchronize; kept for callers
// of the old name).
void cuda_backend_synchronize(Backend& be);

// Device memory as three witnesses see it: the ledger (requested bytes by category), the caching
// allocator (what it holds from CUDA), and the driver (cudaMemGetInfo: everything on the device,
// other processes and the CUDA context included).
struct CudaMemoryReport {
  int device = -1;
  int64_t ledger_current_bytes = 0, ledger_peak_bytes = 0;
  int64_t allocator_reserved_bytes = 0, allocator_cached_bytes = 0, allocator_peak_reserved_bytes = 0;
  int64_t allocator_host_pinned_bytes = 0;
  int64_t allocator_cuda_calls = 0;
  int64_t driver_free_bytes = 0, driver_total_bytes = 0;
  int64_t driver_used_bytes() const { return driver_total_bytes - driver_free_bytes; }
};
// Throws std::invalid_argument when `be` is not a CUDA backend.
CudaMemoryReport cuda_memory_report(Backend& be);
std::string to_string(const CudaMemoryReport& r);

}  // namespace ctx::exec
