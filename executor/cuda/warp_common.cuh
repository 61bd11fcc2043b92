// Warp-level helpers shared by the kernels (full-warp shuffles: every lane must take part).
#pragma once

namespace ctx::exec::cuda::dev {

constexpr unsigned kFull = 0xffffffffu;

template <typename T>
__device__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

}  // namespace ctx::exec::cuda::dev
