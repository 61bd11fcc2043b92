// Bounds on inputs that would otherwise run for minutes or exhaust memory (issue 17). Every refusal
// names its bound and the valid range; the README's "Limits" section lists them all.
#pragma once
#include <cstdint>

namespace ctx {

// GPUs in one cluster (nodes x GPUs per node), from a profile, a shorthand, --gpus or the GUI's
// edited cluster: `plan` on the largest takes seconds (4096x8 H100s, Llama-3.1-405B, 1m tokens:
// 8.5 s on a loaded 2-core machine; 1,048,576 nodes took 63 s before the bound). Llama 3 trained
// on 16,384 GPUs; twice that is the ceiling.
constexpr int64_t kMaxClusterGpus = 32768;

}  // namespace ctx
