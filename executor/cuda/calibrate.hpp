// What ctxrun-calibrate measures on one machine, as raw samples (seconds for a known amount of
// work). calibrate.cu takes the samples on the GPU; calibrate_profile.cpp turns them into the
// hardware profile's curves. Plain structs: this header is read by nvcc and by the host compiler.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ctx::exec::calib {

struct GemmSample {
  int64_t m = 0, n = 0, k = 0;
  std::string dtype;       // "bf16" or "fp32"
  double seconds = 0;      // per call, median of the timed repetitions
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

struct CopySample {
  double bytes_moved = 0;  // read + written
  double seconds = 0;
};

struct AttentionSample {
  std::string kernel;      // "ctxrun_fp32" (this backend's kernel)
  int64_t seq = 0, head_dim = 0, q_heads = 0, kv_heads = 0;
  bool causal = true;
  double pairs = 0;        // visible (query, key) pairs per head
  double fwd_seconds = 0, bwd_seconds = 0;
  // FLOPs as the cost model counts them (costmodel/step_model.cpp): 4 d per visible pair and
  // query head forward, 2.5x that backward.
  double fwd_flops() const { return 4.0 * static_cast<double>(head_dim) * static_cast<double>(q_heads) * pairs; }
  double bwd_flops() const { return 2.5 * fwd_flops(); }
};

struct CollectiveSample {
  std::string op;          // all_reduce, all_gather, reduce_scatter, all_to_all, p2p
  int ranks = 0;
  double bytes = 0;        // message size as nccl-tests counts it (the full buffer)
  double seconds = 0;
  double busbw_bytes_per_second() const;  // algbw x nccl-tests' bus factor
};

struct Measurements {
  std::string device_name, driver, tool = "ctxrun-calibrate";
  std::string cudnn_version;  // empty when cuDNN is not linked
  int sm = 0;
  double total_bytes = 0, free_bytes = 0;  // cudaMemGetInfo after the context is up
  std::vector<GemmSample> gemm;
  std::vector<CopySample> device_copy;
  double h2d_bytes_per_second = 0, d2h_bytes_per_second = 0;  // pinned, largest transfer
  double launch_seconds = 0;
  std::vector<AttentionSample> attention;
  std::vector<CollectiveSample> collectives;  // empty with fewer than two GPUs
  double collective_launch_seconds = 0;       // smallest all_reduce
};

struct Options {
  bool quick = false;        // a smaller grid (a minute instead of several)
  bool collectives = true;   // NCCL collectives over all visible GPUs of this node
};

// Measures this machine. Throws std::runtime_error("no CUDA device ...") without one.
Measurements measure(const Options& o);

}  // namespace ctx::exec::calib
