// bfloat16 on the host: the top 16 bits of an IEEE float32, rounded to nearest even (the rounding
// of PyTorch's and CUDA's __float2bfloat16_rn); NaN stays a quiet NaN.
#pragma once
#include <cstdint>
#include <cstring>

namespace ctx::exec {

inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(u >> 16);
}

inline float bf16_to_f32(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

}  // namespace ctx::exec
