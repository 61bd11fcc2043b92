// One GPU type, and a cluster of them. Loaded from profiles/hardware and profiles/clusters,
// or written `<nodes>x<gpus per node>x<gpu>` on the command line (profile_store.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/curve.hpp"

namespace ctx {

// Achieved throughput of the kernels a training step runs, as curves over their size.
// One attention implementation on this GPU (names and choice: attention_kernels.hpp).
struct AttentionKernel {
  std::string name;       // "fa2", "fa3", "cudnn", "flex", "sdpa", "triton", "ctxrun_mma", ...
  std::string source;
  Curve fwd, bwd;         // causal mask: efficiency vs key/value tokens per call (vs peak bf16), head dim 128
  Curve full_fwd, full_bwd;  // no mask; empty: as the causal curves
  Curve head_dim;         // factor on the curves vs head dim (1 at 128); empty: 1
  bool document_mask = true;  // packed documents through a variable-length entry (cu_seqlens, block masks)
  std::string document_mask_source;
};
struct KernelCurves {
  Curve gemm;             // efficiency vs the GEMM's FLOPs (2*M*N*K), vs peak bf16
  Curve gemm_fp8;         // the same for FP8 GEMMs, vs peak fp8 (kernels.gemm_fp8_gflop); empty: gemm
  Curve gemm_fp32;        // fp32 GEMMs (precision=fp32), vs peak bf16 (kernels.gemm_fp32_gflop, written by
                          // ctxrun-calibrate); empty: gemm, which prices fp32 plans optimistically
  std::vector<AttentionKernel> attention;
  Curve memory;           // efficiency vs bytes moved, vs hbm_bytes_per_second
  double launch_seconds = 0;  // fixed cost per kernel
  std::string source;
};
// Collectives in nccl-tests terms: bus bandwidth as a fraction of the link's one-way rate.
struct CollectiveCurves {
  double all_reduce = 0.8, all_gather = 0.8, reduce_scatter = 0.8, all_to_all = 0.75, p2p = 0.88;  // intra-node
  double inter_efficiency = 0.9;  // fraction of the NIC rate achieved across nodes
  double launch_seconds = 0;      // fixed cost per collective call
  std::string source;
};

struct HardwareSpec {
  std::string name;                     // "H100-SXM-80GB"
  std::vector<std::string> aliases;     // "h100", ...
  std::string source;
  double peak_bf16_flops = 0;           // dense, no sparsity, FLOP/s
  double peak_fp8_flops = 0;            // dense, FLOP/s (0 where the GPU has no fp8)
  int64_t hbm_bytes = 0;                // total device memory
  int64_t usable_bytes = 0;             // what a process can allocate after the CUDA context
  double hbm_bytes_per_second = 0;      // peak memory bandwidth
  double pcie_bytes_per_second = 0;     // achieved host<->device copy rate, one direction, pinned
  double sm_count = 0;                  // streaming multiprocessors (0: not stated; tp_overlap's SM share needs it)
  // NCCL's NVLS (NVLink SHARP multicast) channels per communicator on this GPU's NVSwitch node: NCCL
  // 2.26 src/transport/nvls.cc ncclNvlsInit, NVLS_NCHANNELS_SM90 16 / NVLS_NCHANNELS_SM100 32, where
  // the device reports CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED (NVSwitch, sm90+; graph/search.cc
  // ncclTopoCompute needs an NVSwitch and compute capability >= 90). 0: no NVLS (framework_memory.hpp)
  int64_t nccl_nvls_channels = 0;
  // Default fabric, used when a cluster is written as a shorthand.
  int64_t default_gpus_per_node = 8;
  double nvlink_bytes_per_second = 0;   // per GPU, one direction
  double nvlink_latency_seconds = 0;
  double network_bytes_per_second = 0;  // inter-node, per GPU, one direction
  double network_latency_seconds = 0;
  int64_t default_host_bytes_per_node = 0;
  KernelCurves kernels;
  CollectiveCurves collectives;
};

struct ClusterSpec {
  std::string name;
  std::string source;
  HardwareSpec gpu;
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;
  double intra_bytes_per_second = 0;    // per GPU, one direction
  double intra_latency_seconds = 0;
  double inter_bytes_per_second = 0;    // per GPU, one direction
  double inter_latency_seconds = 0;
  int64_t host_bytes_per_node = 0;
};

inline int64_t world_size(const ClusterSpec& c) { return c.nodes * c.gpus_per_node; }

}  // namespace ctx
