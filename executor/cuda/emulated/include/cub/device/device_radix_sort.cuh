// The emulated build's cub::DeviceRadixSort (the one CUB call the backend makes, in
// kernels_elementwise.cu's embedding backward): a stable sort by the key bits [begin_bit, end_bit),
// queued on the emulated stream like the real one, with the real one's two-call protocol (a first
// call with no temporary storage asks its size). On this include path before the toolkit's, only
// in the emulated build.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "executor/cuda/emulated/emu_device.hpp"

namespace cub {

struct DeviceRadixSort {
  template <typename K, typename V>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* values_in,
                               V* values_out, int n, int begin_bit = 0, int end_bit = sizeof(K) * 8,
                               cudaStream_t stream = nullptr) {
    if (temp == nullptr) {
      temp_bytes = 256;
      return cudaSuccess;
    }
    if (n <= 0) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> lock(ctx_emu::Device::get().mutex());
    ctx_emu::Op op;
    op.what = "cub::DeviceRadixSort::SortPairs";
    op.start = [=] {
      const uint64_t mask = (end_bit >= 64 ? ~uint64_t{0} : ((uint64_t{1} << end_bit) - 1)) & ~((uint64_t{1} << begin_bit) - 1);
      std::vector<int> order(static_cast<size_t>(n));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return (static_cast<uint64_t>(keys_in[a]) & mask) < (static_cast<uint64_t>(keys_in[b]) & mask);
      });
      std::vector<K> k(static_cast<size_t>(n));
      std::vector<V> v(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) k[i] = keys_in[order[i]], v[i] = values_in[order[i]];
      std::copy(k.begin(), k.end(), keys_out);
      std::copy(v.begin(), v.end(), values_out);
      return true;
    };
    ctx_emu::Device::get().enqueue(stream, std::move(op));
    return cudaSuccess;
  }
};

}  // namespace cub
