// Launchers of the flash-style attention kernels (device code and design notes:
// attention_kernels.cuh). Status: compiles, untested on GPU (docs/CUDA.md).
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

void attention_init() {  // the shared-memory opt-in is per device
  static std::vector<bool> done;
  int dev = 0;
  CTX_CUDA(cudaGetDevice(&dev));
  if (static_cast<size_t>(dev) < done.size() && done[dev]) return;
  const int most = static_cast<int>(std::max(fwd_smem(kMaxHeadDim), std::max(dq_smem(kMaxHeadDim), dkdv_smem(kMaxHeadDim))));
  CTX_CUDA(cudaFuncSetAttribute(attn_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
  CTX_CUDA(cudaFuncSetAttribute(attn_dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
  CTX_CUDA(cudaFuncSetAttribute(attn_dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
  if (done.size() <= static_cast<size_t>(dev)) done.resize(dev + 1, false);
  done[dev] = true;
}

void attention_forward(float* o, float* lse, const float* q, const float* k, const float* v, const AttnTokens& t,
                       const AttnDims& sh, cudaStream_t s) {
  const Geo G = geo(sh);
  if (t.tq <= 0 || t.tk <= 0) return;
  attention_init();
  dim3 grid(row_blocks(t.tq, G.group), static_cast<unsigned>(G.hkv));
  CTX_LAUNCH(grid, kWarps * 32, fwd_smem(G.d), s, attn_fwd_kernel)(o, lse, q, t.q_index, t.q_doc, t.tq, k, v, t.k_index,
                                                           t.k_doc, t.tk, t.kv_range, G);
  CTX_CUDA_LAUNCHED("attention_forward_block");
}

void attention_backward(float* dq, float* dk, float* dv, const float* q, const float* k, const float* v,
                        const AttnTokens& t, const float* dout, const float* lse, const float* delta,
                        const AttnDims& sh, cudaStream_t s) {
  const Geo G = geo(sh);
  if (t.tq <= 0 || t.tk <= 0) return;
  attention_init();
  dim3 gq(row_blocks(t.tq, G.group), static_cast<unsigned>(G.hkv));
  CTX_LAUNCH(gq, kWarps * 32, dq_smem(G.d), s, attn_dq_kernel)(dq, q, t.q_index, t.q_doc, t.tq, k, v, t.k_index, t.k_doc, t.tk,
                                                       t.kv_range, dout, lse, delta, G);
  CTX_CUDA_LAUNCHED("attention_backward_block dq");
  dim3 gk(key_blocks(t.tk), static_cast<unsigned>(G.hkv));
  CTX_LAUNCH(gk, kWarps * 32, dkdv_smem(G.d), s, attn_dkdv_kernel)(dk, dv, q, t.q_index, t.q_doc, t.tq, k, v, t.k_index,
                                                           t.k_doc, t.tk, t.kv_range, dout, lse, delta, G);
  CTX_CUDA_LAUNCHED("attention_backward_block dkdv");
}

}  // namespace ctx::exec::cuda::k
