// Launchers of the tensor-core attention (device code and design notes:
// attention_mma_kernels.cuh). Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md); the mixed-dtype backward
// instantiations (f32 dq with bf16 dk/dv) came after that run: untested on GPU.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/cuda/attention_mma.hpp"
#include "executor/cuda/attention_mma_kernels.cuh"
#include "executor/cuda/cuda_check.hpp"
#include "executor/cuda/launch.cuh"

namespace ctx::exec::cuda::k {
namespace {

using namespace dev;

MmaGeo geo(const AttnDims& sh, std::initializer_list<const void*> ptrs) {
  if (!attention_mma_supported(sh))
    throw std::invalid_argument("CUDA tensor-core attention: head_dim " + std::to_string(sh.head_dim) + ", q_heads " +
                                std::to_string(sh.q_heads) + ", kv_heads " + std::to_string(sh.kv_heads) +
                                " unsupported (head_dim a multiple of 16 in 16.." + std::to_string(kMmaMaxHeadDim) +
                                ", q_heads a multiple of kv_heads); use the SIMT kernel");
  bool vec16 = true;
  for (const void* p : ptrs) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    if (a % 4 != 0) throw std::invalid_argument("CUDA tensor-core attention: q, k, v, dout must be 4-byte aligned");
    vec16 = vec16 && a % 16 == 0;
  }
  return {sh.q_heads, sh.kv_heads, sh.q_heads / sh.kv_heads, static_cast<int32_t>(sh.head_dim), vec16 ? 1 : 0,
          sh.scale};
}

template <int kD, typename T>
void opt_in() {
  using Tl = MmaTiles<kD>;
  CTX_CUDA(cudaFuncSetAttribute(attn_mma_fwd_kernel<kD, Tl::fwd_keys, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(mma_fwd_smem(kD, Tl::fwd_keys))));
  CTX_CUDA(cudaFuncSetAttribute(attn_mma_dq_kernel<kD, Tl::dq_keys, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(mma_dq_smem(kD, Tl::dq_keys))));
  CTX_CUDA(cudaFuncSetAttribute(attn_mma_dkdv_kernel<kD, Tl::dkdv_rows, T>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(mma_dkdv_smem(kD, Tl::dkdv_rows))));
}

template <int kD, typename T>
void forward(T* o, float* lse, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, const AttnTokens& t,
             const MmaGeo& G, cudaStream_t s) {
  constexpr int kN = MmaTiles<kD>::fwd_keys;
  const dim3 grid(mma_row_blocks(t.tq, G.group), static_cast<unsigned>(G.hkv));
  CTX_LAUNCH(grid, kMmaThreads, mma_fwd_smem(G.d, kN), s, attn_mma_fwd_kernel<kD, kN, T>)(
      o, lse, q, t.q_index, t.q_doc, t.tq, k, v, t.k_index, t.k_doc, t.tk, t.kv_range, G);
  CTX_CUDA_LAUNCHED("attention_mma_forward");
}

template <int kD, typename TQ, typename TKV>
void backward(TQ* dq, TKV* dk, TKV* dv, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v, const AttnTokens& t,
              const bf16_bits* dout, const float* lse, const float* delta, const MmaGeo& G, cudaStream_t s) {
  constexpr int kN = MmaTiles<kD>::dq_keys, kM = MmaTiles<kD>::dkdv_rows;
  const dim3 gq(mma_row_blocks(t.tq, G.group), static_cast<unsigned>(G.hkv));
  CTX_LAUNCH(gq, kMmaThreads, mma_dq_smem(G.d, kN), s, attn_mma_dq_kernel<kD, kN, TQ>)(
      dq, q, t.q_index, t.q_doc, t.tq, k, v, t.k_index, t.k_doc, t.tk, t.kv_range, dout, lse, delta, G);
  CTX_CUDA_LAUNCHED("attention_mma_backward dq");
  const dim3 gk(mma_key_blocks(t.tk), static_cast<unsigned>(G.hkv));
  CTX_LAUNCH(gk, kMmaThreads, mma_dkdv_smem(G.d, kM), s, attn_mma_dkdv_kernel<kD, kM, TKV>)(
      dk, dv, q, t.q_index, t.q_doc, t.tq, k, v, t.k_index, t.k_doc, t.tk, t.kv_range, dout, lse, delta, G);
  CTX_CUDA_LAUNCHED("attention_mma_backward dkdv");
}

}  // namespace

bool attention_mma_supported(const AttnDims& sh) {
  return mma_bucket(sh.head_dim) != 0 && sh.kv_heads >= 1 && sh.q_heads >= sh.kv_heads &&
         sh.q_heads % sh.kv_heads == 0 && sh.kv_heads <= 65535;
}

void attention_mma_init() {  // the shared-memory opt-in is per device
  static std::vector<bool> done;
  int dev = 0;
  CTX_CUDA(cudaGetDevice(&dev));
  if (static_cast<size_t>(dev) < done.size() && done[dev]) return;
  opt_in<32, float>();
  opt_in<64, float>();
  opt_in<128, float>();
  opt_in<32, bf16_bits>();
  opt_in<64, bf16_bits>();
  opt_in<128, bf16_bits>();
  if (done.size() <= static_cast<size_t>(dev)) done.resize(dev + 1, false);
  done[dev] = true;
}

template <typename TO>
void attention_mma_forward(TO* o, float* lse, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                           const AttnTokens& t, const AttnDims& sh, cudaStream_t s) {
  const MmaGeo G = geo(sh, {q, k, v});
  if (t.tq <= 0 || t.tk <= 0) return;
  attention_mma_init();
  switch (mma_bucket(G.d)) {
    case 32: return forward<32>(o, lse, q, k, v, t, G, s);
    case 64: return forward<64>(o, lse, q, k, v, t, G, s);
    default: return forward<128>(o, lse, q, k, v, t, G, s);
  }
}

template <typename TQ, typename TKV>
void attention_mma_backward(TQ* dq, TKV* dk, TKV* dv, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                            const AttnTokens& t, const bf16_bits* dout, const float* lse, const float* delta,
                            const AttnDims& sh, cudaStream_t s) {
  const MmaGeo G = geo(sh, {q, k, v, dout});
  if (t.tq <= 0 || t.tk <= 0) return;
  attention_mma_init();
  switch (mma_bucket(G.d)) {
    case 32: return backward<32>(dq, dk, dv, q, k, v, t, dout, lse, delta, G, s);
    case 64: return backward<64>(dq, dk, dv, q, k, v, t, dout, lse, delta, G, s);
    default: return backward<128>(dq, dk, dv, q, k, v, t, dout, lse, delta, G, s);
  }
}

template void attention_mma_forward<float>(float*, float*, const bf16_bits*, const bf16_bits*, const bf16_bits*,
                                           const AttnTokens&, const AttnDims&, cudaStream_t);
template void attention_mma_forward<bf16_bits>(bf16_bits*, float*, const bf16_bits*, const bf16_bits*,
                                               const bf16_bits*, const AttnTokens&, const AttnDims&, cudaStream_t);
#define CTX_MMA_BACKWARD(TQ, TKV)                                                                                \
  template void attention_mma_backward<TQ, TKV>(TQ*, TKV*, TKV*, const bf16_bits*, const bf16_bits*, const bf16_bits*, \
                                                const AttnTokens&, const bf16_bits*, const float*, const float*,       \
                                                const AttnDims&, cudaStream_t);
// dq and dk, dv each f32 or bf16: the trainer keeps dq in f32 and dk, dv in bf16 (bf16 plans)
CTX_MMA_BACKWARD(float, float)
CTX_MMA_BACKWARD(bf16_bits, bf16_bits)
CTX_MMA_BACKWARD(float, bf16_bits)
CTX_MMA_BACKWARD(bf16_bits, float)
#undef CTX_MMA_BACKWARD

}  // namespace ctx::exec::cuda::k
