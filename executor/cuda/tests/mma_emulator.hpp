// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the CUDA emulator (cuda_emulator.hpp):
// the fragment layout of the PTX ISA ("Matrix Fragments for mma.m16n8k16 with floating point
// type"), so that a kernel's fragment indexing can be checked on the CPU.
//
// Per lane (groupID = laneid >> 2, threadID_in_group = laneid % 4, written g and t below):
//  A (16x16, row-major, bf16): 4 .b32 registers holding a0..a7, two per register, the lower index
//    in the low 16 bits. row(ai) = g for i in {0,1,4,5}, g + 8 otherwise;
//    col(ai) = 2t + (i & 1), plus 8 for i >= 4.
//  B (16x8, "col": element (k, n)), 2 registers holding b0..b3: row(bi) = k = 2t + (i & 1), plus 8
//    for i >= 2; col(bi) = n = g.
//  C, D (16x8, f32): c0..c3: row = g for c0, c1, g + 8 for c2, c3; col = 2t + (i & 1).
// The product: D = A*B + C with bf16 inputs (exact products in fp32) summed in fp32 in k order,
// C first. Hardware adds in an unspecified order, with at least fp32 precision: compare with a
// reference at the tolerance of 17 fp32 additions (see the test).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace ctx_emu::mma {

// bf16 as raw bits; round to nearest even, as __float2bfloat16_rn
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct FragA {
  uint32_t r[4] = {};
};
struct FragB {
  uint32_t r[2] = {};
};
struct FragC {
  float c[4] = {};
};

// The PTX ISA's index formulas.
inline unsigned a_row(unsigned lane, unsigned i) { return (lane >> 2) + ((i & 2) ? 8 : 0); }
inline unsigned a_col(unsigned lane, unsigned i) { return (lane % 4) * 2 + (i & 1) + (i >= 4 ? 8 : 0); }
inline unsigned b_row(unsigned lane, unsigned i) { return (lane % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0); }
inline unsigned b_col(unsigned lane, unsigned) { return lane >> 2; }
inline unsigned c_row(unsigned lane, unsigned i) { return (lane >> 2) + (i >= 2 ? 8 : 0); }
inline unsigned c_col(unsigned lane, unsigned i) { return (lane % 4) * 2 + (i & 1); }

inline uint16_t half_of(const uint32_t* regs, unsigned i) { return static_cast<uint16_t>(regs[i / 2] >> (16 * (i & 1))); }
inline void set_half(uint32_t* regs, unsigned i, uint16_t v) {
  const unsigned sh = 16 * (i & 1);
  regs[i / 2] = (regs[i / 2] & ~(0xffffu << sh)) | (static_cast<uint32_t>(v) << sh);
}

// What a kernel does to fill its fragments: A row-major [16][lda], B as B[k * ldb + n] (k rows,
// n columns), C/D row-major [16][ldc].
inline FragA load_a_fragment(const uint16_t* A, int lda, unsigned lane) {
  FragA f;
  for (unsigned i = 0; i < 8; ++i) set_half(f.r, i, A[a_row(lane, i) * lda + a_col(lane, i)]);
  return f;
}
inline FragB load_b_fragment(const uint16_t* B, int ldb, unsigned lane) {
  FragB f;
  for (unsigned i = 0; i < 4; ++i) set_half(f.r, i, B[b_row(lane, i) * ldb + b_col(lane, i)]);
  return f;
}
inline FragC load_c_fragment(const float* C, int ldc, unsigned lane) {
  FragC f;
  for (unsigned i = 0; i < 4; ++i) f.c[i] = C[c_row(lane, i) * ldc + c_col(lane, i)];
  return f;
}
inline void store_c_fragment(float* D, int ldc, unsigned lane, const FragC& f) {
  for (unsigned i = 0; i < 4; ++i) D[c_row(lane, i) * ldc + c_col(lane, i)] = f.c[i];
}

// The warp-collective operation, given the 32 lanes' fragments: what the tensor core computes.
inline void mma_m16n8k16_bf16(const FragA* a, const FragB* b, const FragC* c, FragC* d) {
  float A[16][16], B[16][8], C[16][8];
  for (unsigned lane = 0; lane < 32; ++lane) {
    for (unsigned i = 0; i < 8; ++i) A[a_row(lane, i)][a_col(lane, i)] = from_bf16(half_of(a[lane].r, i));
    for (unsigned i = 0; i < 4; ++i) B[b_row(lane, i)][b_col(lane, i)] = from_bf16(half_of(b[lane].r, i));
    for (unsigned i = 0; i < 4; ++i) C[c_row(lane, i)][c_col(lane, i)] = c[lane].c[i];
  }
  for (unsigned lane = 0; lane < 32; ++lane)
    for (unsigned i = 0; i < 4; ++i) {
      const unsigned m = c_row(lane, i), n = c_col(lane, i);
      float s = C[m][n];
      for (unsigned k = 0; k < 16; ++k) s += A[m][k] * B[k][n];  // each product exact in fp32
      d[lane].c[i] = s;
    }
}

}  // namespace ctx_emu::mma

// Inside an emulated kernel: mma.sync by every lane of a warp (a warp barrier, like a shuffle).
// Needs cuda_emulator.hpp included before this header.
namespace ctx_emu::mma {
inline FragC mma_sync(const FragA& a, const FragB& b, const FragC& c) {
  struct Staging {
    std::vector<FragA> a;
    std::vector<FragB> b;
    std::vector<FragC> c;
  };
  static Staging st[2];  // [warp generation % 2], as the shuffles' slots
  BlockState& bs = *state();
  const unsigned n = bs.block_dim.x * bs.block_dim.y, idx = my_index(), base = idx & ~31u, g = me().warp_gen % 2;
  if (st[g].a.size() < n) st[g].a.resize(n), st[g].b.resize(n), st[g].c.resize(n);
  st[g].a[idx] = a;
  st[g].b[idx] = b;
  st[g].c[idx] = c;
  syncwarp();
  FragC d[32];
  mma_m16n8k16_bf16(&st[g].a[base], &st[g].b[base], &st[g].c[base], d);
  return d[idx - base];
}
}  // namespace ctx_emu::mma
