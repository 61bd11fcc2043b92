// Attention across the context-parallel group, written once against Backend and Comm:
//   ring / zig-zag  K,V blocks travel around the ring group with non-blocking p2p posted before the
//                   current block's compute; partial results merge through the saved log-sum-exp;
//                   in backward dK,dV (fp32) travel with their block and return to the owner.
//   all-gather      K,V of the whole CP group gathered, dK,dV reduce-scattered back (fp32).
//   Ulysses         all-to-all from sequence- to head-sharding (KV heads replicated when the degree
//                   exceeds them, their gradients summed on the way back), attention on the whole
//                   sequence, all-to-all back.
//   Ulysses x ring  the all-to-all inside the Ulysses group, the ring across Ulysses groups.
// Masking is by token identity (global index, document id), never an s x s mask, so any placement
// and documents crossing rank boundaries are masked exactly; each key block also carries, per
// query row, the hull of the key rows it can see, so kernels bound their loops.
// Under bf16 the output of several merged blocks and dQ accumulate in fp32 buffers and are rounded
// to bf16 once at the end (as ring-flash-attention and FlashAttention's dq_accum do); dK, dV are
// written once: by the kernel (one block), from the ring's travelling fp32 buffers, or by the
// reduce-scatter of the all-gathered fp32 dK, dV.
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

// This rank's view of one micro-batch, on the host.
struct SequenceMeta {
  std::vector<int64_t> local_index;
  std::vector<int32_t> tokens, labels, doc, pos;     // local tokens, in local order
  std::vector<std::vector<int64_t>> block_index;     // key blocks: per ring rank (or per CP rank for all-gather)
  std::vector<std::vector<int32_t>> block_doc;
  std::vector<std::vector<int32_t>> kv_range;        // per key block: [queries of my block, 2] visible hulls
  int64_t my_block = 0;                              // the block holding this rank's attention queries
};
// One micro-batch (plan.mbs sequences of equal length) as this rank sees it.
SequenceMeta make_sequence_meta(const ParallelContext& pc, const std::vector<const Sequence*>& batch);

// Per query row of (q_index, q_doc), the hull [lo, hi) of rows of the key block (k_index, k_doc)
// that the causal document mask lets it see; lo == hi when none. O((q + k) log k).
std::vector<int32_t> visible_hulls(const std::vector<int64_t>& q_index, const std::vector<int32_t>& q_doc,
                                   const std::vector<int64_t>& k_index, const std::vector<int32_t>& k_doc);

// The same micro-batch on the device: uploaded once, read by every layer (Mem::mask: the masking
// metadata that replaces an s x s mask, plus token ids, labels and positions).
struct DeviceBatch {
  Tensor tokens, labels, pos;                  // i32 [tokens]
  Tensor q_index, q_doc;                       // the attention queries' identities (my block)
  std::vector<Tensor> k_index, k_doc, kv_range;  // per key block
  int64_t my_block = 0;
  int64_t valid_labels = 0;                    // labels >= 0 on this rank (host-known)
  TokenRefs queries() const { return {q_index, q_doc}; }
  KeyBlock block(int64_t b) const { return {{k_index[b], k_doc[b]}, kv_range[b]}; }
};
DeviceBatch upload_batch(Backend& be, const SequenceMeta& s);

class ContextAttention {
 public:
  ContextAttention(Backend& be, ParallelContext& pc, const Layout& l) : be_(be), pc_(pc), l_(l) {}
  // q [T, q_heads*d], k,v [T, kv_heads*d] in sequence layout (after RoPE). Writes o [T, q_heads*d]
  // (sequence layout) and lse f32 [attn_tokens, attn_q_heads].
  void forward(const DeviceBatch& b, View q, View k, View v, Tensor& o, Tensor& lse);
  // Gradients in sequence layout, overwritten (dtype of q).
  void backward(const DeviceBatch& b, View q, View k, View v, View o, View lse, View dout, View dq, View dk, View dv);
  // forward() calls so far: one per layer and micro-batch, plus one per recomputed layer (the
  // denominator of the report's attention pairs per layer forward)
  int64_t forward_calls() const { return forward_calls_; }

 private:
  Tensor to_heads(View x, int64_t heads, bool kv, Mem cat);
  // All-gathered K and V of the whole sequence over the CP group (all-gather KV), [cp*Ta, kv heads*d] each.
  std::pair<Tensor, Tensor> gather_kv(View k, View v);
  void to_sequence(View xa, int64_t heads, bool kv, View out);
  void core_forward(const DeviceBatch& b, View q, View k, View v, View o, View lse);
  // dq: an fp32 accumulator (zeroed by the caller); dk, dv: the outputs, zeroed, written once (one
  // kernel call, the ring's travelling fp32 dK,dV copied home, or the reduce-scatter)
  void core_backward(const DeviceBatch& b, View q, View k, View v, View dout, View lse, View delta, View dq, View dk,
                     View dv);
  // dq, dk, dv (overwritten) of the core in its own layout: dq through an fp32 accumulator
  void gradients(const DeviceBatch& b, View q, View k, View v, View dout, View lse, View delta, View dq, View dk,
                 View dv);
  // An fp32 accumulator of `out`'s shape: `out` itself when it is f32 (zeroed), else a new zeroed
  // f32 tensor held in `hold`; finish() rounds it into `out`.
  View accumulator(View out, Tensor& hold);
  void finish(View out, Tensor& hold);
  int64_t key_blocks() const;
  AttnShape shape() const;
  Backend& be_;
  ParallelContext& pc_;
  Layout l_;
  int64_t forward_calls_ = 0;
};

}  // namespace ctx::exec
