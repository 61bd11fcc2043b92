// bfloat16 storage in device code: raw 16-bit words (uint16_t), widened to float for arithmetic
// and rounded once on store, to nearest even with NaN kept quiet -- bit for bit the host's
// executor/bf16.hpp, which the CPU reference backend uses. Plain integer code, so the same source
// compiles under nvcc and under the CPU emulator (cuda_emulator.hpp), where cuda_bf16.h is not
// usable; two packed values form one .b32 register of an mma.sync fragment (low half = lower index).
//
// ld(p, i) / st(p, i, f) read and write element i of a float or bf16 array as float, so a kernel
// templated on its storage type T in {float, uint16_t} has one body for both.
#pragma once
#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <cstring>
#endif

namespace ctx::exec::cuda::dev {

using bf16_bits = uint16_t;

__device__ inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
__device__ inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

__device__ inline float bf16_to_float(bf16_bits b) { return bits_float(static_cast<uint32_t>(b) << 16); }
__device__ inline bf16_bits float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu)) return static_cast<bf16_bits>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<bf16_bits>(u >> 16);
}
// two values as one mma fragment register: lo in bits 0..15
__device__ inline uint32_t pack_bf16x2(float lo, float hi) {
  return static_cast<uint32_t>(float_to_bf16(lo)) | (static_cast<uint32_t>(float_to_bf16(hi)) << 16);
}

__device__ inline float ld(const float* p, int64_t i) { return p[i]; }
__device__ inline float ld(const bf16_bits* p, int64_t i) { return bf16_to_float(p[i]); }
__device__ inline void st(float* p, int64_t i, float f) { p[i] = f; }
__device__ inline void st(bf16_bits* p, int64_t i, float f) { p[i] = float_to_bf16(f); }

}  // namespace ctx::exec::cuda::dev
