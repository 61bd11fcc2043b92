// Launchers of the flash-style attention kernels (device code and design notes:
// attention_kernels.cuh), instantiated for float and bf16 storage of the inputs and of each
// output. Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md).
#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/cuda/attention_kernels.cuh"
#include "executor/cuda/cuda_check.hpp"
#include "executor/cuda/launch.cuh"
#include "executor/cuda/kernels.hpp"

namespace ctx::exec::cuda::k {
namespace {

using namespace dev;

Geo geo(const AttnDims& sh) {
  if (sh.head_dim < 1 || sh.head_dim > kMaxHeadDim)
    throw std::invalid_argument("CUDA attention: head_dim " + std::to_string(sh.head_dim) + " outside 1.." +
                                std::to_string(kMaxHeadDim));
  if (sh.kv_heads < 1 || sh.q_heads % sh.kv_heads != 0)
    throw std::invalid_argument("CUDA attention: q_heads " + std::to_string(sh.q_heads) +
                                " is not a multiple of kv_heads " + std::to_string(sh.kv_heads));
  return {sh.q_heads, sh.kv_heads, sh.head_dim, sh.q_heads / sh.kv_heads, sh.scale};
}

}  // namespace

namespace {
// The kernels' instantiations: inputs T and output TO (o; dq; dk, dv), each float or bf16 bits.
template <typename T, typename TO>
void opt_in_smem(int most) {
  CTX_CUDA(cudaFuncSetAttribute(attn_fwd_kernel<T, TO>, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
  CTX_CUDA(cudaFuncSetAttribute(attn_dq_kernel<T, TO>, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
  CTX_CUDA(cudaFuncSetAttribute(attn_dkdv_kernel<T, TO>, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
}
}  // namespace

void attention_init() {  // the shared-memory opt-in is per device, for each kernel instantiation
  static std::vector<bool> done;
  int dev = 0;
  CTX_CUDA(cudaGetDevice(&dev));
  if (static_cast<size_t>(dev) < done.size() && done[dev]) return;
  const int most = static_cast<int>(std::max(fwd_smem(kMaxHeadDim), std::max(dq_smem(kMaxHeadDim), dkdv_smem(kMaxHeadDim))));
  opt_in_smem<float, float>(most);
  opt_in_smem<float, bf16_bits>(most);
  opt_in_smem<bf16_bits, float>(most);
  opt_in_smem<bf16_bits, bf16_bits>(most);
  if (done.size() <= static_cast<size_t>(dev)) done.resize(dev + 1, false);
  done[dev] = true;
}

template <typename T, typename TO>
void attention_forward(TO* o, float* lse, const T* q, const T* k, const T* v, const AttnTokens& t, const AttnDims& sh,
                       cudaStream_t s) {
  const Geo G = geo(sh);
  if (t.tq <= 0 || t.tk <= 0) return;
  attention_init();
  dim3 grid(row_blocks(t.tq, G.group), static_cast<unsigned>(G.hkv));
  CTX_LAUNCH(grid, kWarps * 32, fwd_smem(G.d), s, attn_fwd_kernel<T, TO>)(o, lse, q, t.q_index, t.q_doc, t.tq, k, v,
                                                                         t.k_index, t.k_doc, t.tk, t.kv_range, G);
  CTX_CUDA_LAUNCHED("attention_forward_block");
}

template <typename T, typename TQ, typename TKV>
void attention_backward(TQ* dq, TKV* dk, TKV* dv, const T* q, const T* k, const T* v, const AttnTokens& t,
                        const T* dout, const float* lse, const float* delta, const AttnDims& sh, cudaStream_t s) {
  const Geo G = geo(sh);
  if (t.tq <= 0 || t.tk <= 0) return;
  attention_init();
  dim3 gq(row_blocks(t.tq, G.group), static_cast<unsigned>(G.hkv));
  CTX_LAUNCH(gq, kWarps * 32, dq_smem(G.d), s, attn_dq_kernel<T, TQ>)(dq, q, t.q_index, t.q_doc, t.tq, k, v, t.k_index,
                                                                      t.k_doc, t.tk, t.kv_range, dout, lse, delta, G);
  CTX_CUDA_LAUNCHED("attention_backward_block dq");
  dim3 gk(key_blocks(t.tk), static_cast<unsigned>(G.hkv));
  CTX_LAUNCH(gk, kWarps * 32, dkdv_smem(G.d), s, attn_dkdv_kernel<T, TKV>)(dk, dv, q, t.q_index, t.q_doc, t.tq, k, v,
                                                                           t.k_index, t.k_doc, t.tk, t.kv_range, dout,
                                                                           lse, delta, G);
  CTX_CUDA_LAUNCHED("attention_backward_block dkdv");
}

#define CTX_FWD(T, TO)                                                                                         \
  template void attention_forward<T, TO>(TO*, float*, const T*, const T*, const T*, const AttnTokens&,        \
                                         const AttnDims&, cudaStream_t);
#define CTX_BWD(T, TQ, TKV)                                                                                     \
  template void attention_backward<T, TQ, TKV>(TQ*, TKV*, TKV*, const T*, const T*, const T*, const AttnTokens&, \
                                               const T*, const float*, const float*, const AttnDims&, cudaStream_t);
CTX_FWD(float, float)
CTX_FWD(float, bf16_bits)
CTX_FWD(bf16_bits, float)
CTX_FWD(bf16_bits, bf16_bits)
CTX_BWD(float, float, float)
CTX_BWD(float, float, bf16_bits)
CTX_BWD(float, bf16_bits, float)
CTX_BWD(float, bf16_bits, bf16_bits)
CTX_BWD(bf16_bits, float, float)
CTX_BWD(bf16_bits, float, bf16_bits)
CTX_BWD(bf16_bits, bf16_bits, float)
CTX_BWD(bf16_bits, bf16_bits, bf16_bits)
#undef CTX_FWD
#undef CTX_BWD

}  // namespace ctx::exec::cuda::k
