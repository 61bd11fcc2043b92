// cuDNN 9 fused SDPA (flash attention) through the backend C graph API (cudnn.h, cudnnBackend*
// descriptors; cudnn-frontend is not used). Status: ran on one H200 on 2026-11-28 (docs/GPU_PROOF.md): the forward and dV
// match float64, dQ and dK do not (cause not found); no training path calls it.
//
//   data        bf16 Q, K, V, O, dO, dQ, dK, dV in this backend's layout: token-major rows, heads x
//               head_dim columns ("BSHD": dims {b, h, s, d}, strides {s h d, d, h d, 1}); the
//               softmax statistics (log-sum-exp per query row and head, fp32, {b, h_q, s_q, 1}) are
//               saved by the forward for the backward.
//   graphs      the patterns cuDNN's fused flash-attention engines recognise (the ones cudnn-frontend
//               builds): forward S = Q K^T, S *= scale, causal mask (GEN_INDEX rows/cols, CMP_GE,
//               BINARY_SELECT of the lowest float), softmax with stats (max, sub, exp, sum, log, add,
//               div), O = P V with P in bf16; backward: delta = rowsum(dO * O), S = Q K^T * scale,
//               mask, P = exp(S - stats), dV = P^T dO, dP = dO V^T, dS = P (dP - delta) * scale,
//               dK = dS^T Q, dQ = dS K (accumulated in fp32 and converted). GQA: K/V carry h_kv heads
//               (h_q a multiple); the backward's dK/dV come from full-head products reduced over each
//               group, as cudnn-frontend does.
//   caching     one forward and one backward graph per shape (batch, heads, lengths, head_dim, causal,
//               scale), each with its execution plan (the first engine config of heuristic mode A that
//               finalises) and workspace size (the plan's, plus the backward's fp32 intermediates).
//   masks       cuDNN's masks are causal, padding (per-sequence lengths) and sliding window, not
//               arbitrary document masks. This serves plans whose attention is one causal document
//               per sequence (a batch of equal-length sequences, b > 1 allowed). Packed sequences
//               with several documents would need ragged offsets (cuDNN's THD layout with
//               cu_seqlens-style offsets, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, plus a padding mask)
//               and are NOT implemented; neither are document masks that span ring blocks. Those plans
//               keep this backend's own kernel (attention.cu).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ctx::exec::cuda {

struct SdpaShape {
  int64_t batch = 1;      // sequences (each one causal document)
  int64_t heads_q = 1;
  int64_t heads_kv = 1;   // divides heads_q (GQA/MQA)
  int64_t seq_q = 0;
  int64_t seq_kv = 0;
  int64_t head_dim = 0;   // multiple of 8, at most 256 (cuDNN's limits)
  bool causal = true;     // top-left aligned (query i sees keys 0..i)
  float scale = 0;        // softmax scale; 0 means 1/sqrt(head_dim)
  bool operator==(const SdpaShape&) const = default;
};

// Device pointers, all bf16 except stats (fp32). Rows are tokens of batch-major sequences.
struct SdpaForwardArgs {
  const void* q;  // [batch * seq_q, heads_q * head_dim]
  const void* k;  // [batch * seq_kv, heads_kv * head_dim]
  const void* v;  // [batch * seq_kv, heads_kv * head_dim]
  void* o;        // [batch * seq_q, heads_q * head_dim]
  float* stats;   // [batch, heads_q, seq_q]: log-sum-exp of each scaled score row
};
struct SdpaBackwardArgs {
  const void *q, *k, *v, *o, *d_o;
  const float* stats;
  void *d_q, *d_k, *d_v;  // written (not accumulated)
};

// The graphs and plans of one cuDNN handle (one device, one stream at a time). Not thread-safe.
class CudnnSdpa {
 public:
  CudnnSdpa();  // cudnnCreate; throws naming the reason when cuDNN or a device is missing
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  // Whether cuDNN supports `s` (builds and caches the graphs; false and a reason if no engine).
  bool supports(const SdpaShape& s, std::string* why = nullptr);
  // Workspace bytes the call needs (graph built and cached on first use).
  int64_t forward_workspace_bytes(const SdpaShape& s);
  int64_t backward_workspace_bytes(const SdpaShape& s);
  // Queued on `stream`; `workspace` holds at least the *_workspace_bytes (256-byte aligned).
  void forward(const SdpaShape& s, const SdpaForwardArgs& a, void* workspace, cudaStream_t stream);
  void backward(const SdpaShape& s, const SdpaBackwardArgs& a, void* workspace, cudaStream_t stream);

  size_t cached_graphs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ctx::exec::cuda
