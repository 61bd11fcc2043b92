// Attention across the context-parallel group, written once against Backend and Comm:
//   ring / zig-zag  K,V blocks travel around the ring group with non-blocking p2p posted before the
//                   current block's compute; partial results merge through the saved log-sum-exp;
//                   in backward dK,dV travel with their block and return to the owner.
//   all-gather      K,V of the whole CP group gathered, dK,dV reduce-scattered back.
//   Ulysses         all-to-all from sequence- to head-sharding (KV heads replicated when the degree
//                   exceeds them, their gradients summed on the way back), attention on the whole
//                   sequence, all-to-all back.
//   Ulysses x ring  the all-to-all inside the Ulysses group, the ring across Ulysses groups.
// Masking is by token identity (global index, document id), never an s x s mask, so any placement
// and documents crossing rank boundaries are masked exactly.
#pragma once
#include <utility>
#include <vector>

#include "executor/backend.hpp"
#include "executor/parallel_context.hpp"

namespace ctx::exec {

// One packed sequence, global, as the data loader produces it.
struct Sequence {
  std::vector<int32_t> tokens, labels, doc, pos;  // labels: next token, -1 where ignored
};

// This rank's view of one sequence.
struct SequenceMeta {
  std::vector<int64_t> local_index;
  std::vector<int32_t> tokens, labels, doc, pos;     // local tokens, in local order
  std::vector<std::vector<int64_t>> block_index;     // key blocks: per ring rank (or per CP rank for all-gather)
  std::vector<std::vector<int32_t>> block_doc;
  int64_t my_block = 0;                              // the block holding this rank's attention queries
};
// One micro-batch (plan.mbs sequences of equal length) as this rank sees it.
SequenceMeta make_sequence_meta(const ParallelContext& pc, const std::vector<const Sequence*>& batch);

class ContextAttention {
 public:
  ContextAttention(Backend& be, ParallelContext& pc, const Layout& l) : be_(be), pc_(pc), l_(l) {}
  // q [T, q_heads*d], k,v [T, kv_heads*d] in sequence layout (after RoPE). Writes o [T, q_heads*d]
  // (sequence layout) and lse [attn_tokens, attn_q_heads].
  void forward(const SequenceMeta& s, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o, Tensor& lse);
  // Gradients in sequence layout; dq, dk, dv are overwritten.
  void backward(const SequenceMeta& s, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);

 private:
  Tensor to_heads(const Tensor& x, int64_t heads, bool kv, Mem cat);
  // All-gathered K and V of the whole sequence over the CP group (all-gather KV), [cp*Ta, kv heads*d] each.
  std::pair<Tensor, Tensor> gather_kv(const float* k, const float* v);
  void to_sequence(const Tensor& xa, int64_t heads, bool kv, Tensor& out);
  void core_forward(const SequenceMeta& s, const float* q, const float* k, const float* v, float* o, float* lse);
  void core_backward(const SequenceMeta& s, const float* q, const float* k, const float* v, const float* dout,
                     const float* lse, const float* delta, float* dq, float* dk, float* dv);
  AttnShape shape() const;
  Backend& be_;
  ParallelContext& pc_;
  Layout l_;
};

}  // namespace ctx::exec
