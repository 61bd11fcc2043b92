// The memory-bound work PyTorch's eager context parallelism does around each ring step's attention
// kernel (RuntimeProfile::cp_eager_merge_fp32): PyTorch torch/distributed/tensor/experimental/
// _attention.py (read at pytorch/pytorch 0123248a) runs ring attention as a Python loop over the ring
// steps for both rotate methods (all-gather and all-to-all) and, with _cp_options.convert_to_f32 (default
// True), merges each step's partial output into an fp32 accumulator with separate elementwise kernels
// (_SDPAMerger) and accumulates the gradients in fp32 in the backward
// (_templated_ring_attention_backward). Counted here op by op from that source, in bytes read plus
// written, for one attention call of one rank; the attention kernels themselves are priced elsewhere.
//
// Notation: E = the rank's query (= output) elements, tokens x query heads x head dim; Ekv = one of
// K or V as the call receives them (expanded to the query heads where the model repeats the KV heads
// first); a = the activation dtype's bytes. Ring of n positions, this rank at position r; step i pairs
// the local queries with the keys of position r - i. Under the load-balanced (head-tail) layout a step
// 1 <= i <= r uses all queries against the first half of the keys, a step i > r the second half of the
// queries ("partial") against all keys; without load balancing a step i > r is skipped.
// Forward (_templated_ring_attention, _SDPAMerger.step / _merge_one, convert_to_f32):
//   once   key.contiguous(), value.contiguous() of SDPA's transposed [b, h, s, d] views  4a Ekv
//          results(): the merged fp32 output back to the activation dtype             (4 + a) E
//   step 0 out.to(float32)                                                             (4 + a) E
//   step i>=1 (O = E, or E/2 when partial): out.to(float32) (4 + a) O; out - block_out 12 O;
//          sigmoid(lse diff) * that 8 O; out - that 12 O; partial: _partial_update's torch.cat of
//          the two fp32 halves 8 E (the [b, h, s, 1] LSE updates are 1/d of this and not counted)
//   step i < n-1: torch.cat([key.flatten(), value.flatten()]) for the rotater              4a Ekv
// Backward (_templated_ring_attention_backward):
//   once   zeros_like(query/key/value, fp32) 4 E + 8 Ekv; key/value.contiguous() 4a Ekv;
//          grad_query.to(dtype) (4 + a) E; the last dK,dV buffer .to(dtype) 2 (4 + a) Ekv
//   step 0 grad_key += grad_key_, grad_value += (fp32 += a-byte) 2 (8 + a) Ekv; grad_query += (8 + a) E
//   step 1<=i<=r: dK,dV _partial_update(add) of the first half 2 ((8 + a) Ekv / 2 + 8 Ekv); grad_query
//          += (8 + a) E
//   step i>r: dK,dV += 2 (8 + a) Ekv; grad_query _partial_update(add) of the second half
//          (8 + a) E / 2 + 8 E
//   skipped step (no load balance): zeros_like fp32 grads 4 E + 8 Ekv, fp32 += fp32 dK,dV 24 Ekv and
//          grad_query 12 E
//   every step: torch.cat of the fp32 dK,dV for the dK,dV rotater 16 Ekv
//   step i < n-1: torch.cat([key.flatten(), value.flatten()]) (the K,V rotater is re-fed every step) 4a Ekv
// Once-per-call bytes are counted in step 0. Not counted: the flash backward's own contiguous copies of
// chunked views, the [b, h, s] LSE ops, kernel launches beyond one per counted op.
#pragma once
#include <cstdint>
#include <vector>

namespace ctx {

struct CpEagerMergeBytes {
  std::vector<double> fwd_bytes, bwd_bytes;  // per ring step i = 0..n-1
  std::vector<double> fwd_ops, bwd_ops;      // elementwise kernels counted per step (one launch each)
};

// The bytes above for one attention call of the rank at ring position `pos` of `ring` positions.
CpEagerMergeBytes cp_eager_merge_bytes(double q_elems, double kv_elems, double act_bytes, int64_t ring, int64_t pos,
                                       bool load_balanced);

}  // namespace ctx
