// Launchers of the tensor-core attention (FlashAttention-2 structure: mma.sync m16n8k16 bf16 ->
// fp32, 64-row query tiles, double-buffered K/V tiles; device code and design notes in
// attention_mma_kernels.cuh, docs/CUDA.md "Tensor-core attention (attention_mma)").
// Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md) (op cases pass; 37-42 TFLOP/s at 8-16K,
// 0.13-0.17x flash SDPA). The mixed-dtype backward (f32 dq, bf16 dk/dv) came after that run: untested on
// GPU. The kernel source runs on the CPU emulator in test_attention_mma_emulated.
//
// Semantics are those of k::attention_forward / k::attention_backward (kernels.hpp) and of the CPU
// reference's attention_forward_block / attention_backward_block, with q, k, v, dout as bf16
// words (uint16_t, round to nearest even) and o, dq, dk, dv as float or bf16 words:
//  - forward: merges this key block into the running (o, lse) (lse f32 [tq, q_heads], -inf: no
//    visible key yet; a row with no visible key in the block is left untouched);
//  - backward: dq, dk, dv += this block's gradients (given the final lse and delta =
//    rowsum(dO * O), f32), summed in fp32 within the call and rounded once when bf16.
// Only head dims that are multiples of 16 in 16..128 with q_heads a multiple of kv_heads are
// supported (attention_mma_supported); other shapes throw std::invalid_argument (use the SIMT
// kernel). Tensors are row-major and contiguous as in kernels.hpp; q, k, v, dout must be 4-byte
// aligned (16-byte aligned ones are copied 16 bytes at a time).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "executor/cuda/kernels.hpp"

namespace ctx::exec::cuda::k {

bool attention_mma_supported(const AttnDims& sh);
// The shared-memory opt-in of every instantiation on the current device (called by the launchers).
void attention_mma_init();

template <typename TO>  // TO in {float, bf16_bits}
void attention_mma_forward(TO* o, float* lse, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                           const AttnTokens& t, const AttnDims& sh, cudaStream_t s);
template <typename TQ, typename TKV>  // each in {float, bf16_bits}
void attention_mma_backward(TQ* dq, TKV* dk, TKV* dv, const bf16_bits* q, const bf16_bits* k, const bf16_bits* v,
                            const AttnTokens& t, const bf16_bits* dout, const float* lse, const float* delta,
                            const AttnDims& sh, cudaStream_t s);

}  // namespace ctx::exec::cuda::k
