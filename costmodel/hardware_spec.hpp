// One GPU type, and a cluster of them. Loaded from profiles/hardware and profiles/clusters,
// or written `<nodes>x<gpus per node>x<gpu>` on the command line (profile_store.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ctx {

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
  // Default fabric, used when a cluster is written as a shorthand.
  int64_t default_gpus_per_node = 8;
  double nvlink_bytes_per_second = 0;   // per GPU, one direction
  double nvlink_latency_seconds = 0;
  double network_bytes_per_second = 0;  // inter-node, per GPU, one direction
  double network_latency_seconds = 0;
  int64_t default_host_bytes_per_node = 0;
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
