// Turns ctxrun-calibrate's samples into a hardware profile: the base profile (ctxplan.hardware/1)
// with the measured curves written under the keys the cost model reads
// (costmodel/profile_store.cpp): kernels.gemm_gflop, kernels.memory_mib, kernels.launch_us,
// kernels.attention.<kernel>.{fwd_tokens,bwd_tokens}, pcie_gbps, hbm_mib/usable_mib and, when
// measured, collectives.intra_busbw_fraction and collectives.launch_us. Everything else in the
// base stays as it was. The raw samples go under "calibration" (ignored by the loader).
// Plain C++: tested on machines without a GPU (executor/cuda/tests/test_calibrate_profile.cpp).
#pragma once
#include <string>

#include "costmodel/json_util.hpp"
#include "executor/cuda/calibrate.hpp"

namespace ctx::exec::calib {

struct MergeOptions {
  std::string name;      // new profile name (empty: keep the base's)
  std::string date;      // ISO date written into the sources
  bool set_memory = true;  // hbm_mib / usable_mib from cudaMemGetInfo
};

// Throws InputError when the base lacks a field the efficiencies need (peak_bf16_tflops,
// hbm_gbps, default_fabric.nvlink_gbps).
json merge_into_profile(const json& base, const Measurements& m, const MergeOptions& o);

// nccl-tests' bus-bandwidth factor for `op` over `ranks` (all_reduce 2(n-1)/n; all_gather,
// reduce_scatter, all_to_all (n-1)/n; p2p 1).
double bus_factor(const std::string& op, int ranks);

}  // namespace ctx::exec::calib
