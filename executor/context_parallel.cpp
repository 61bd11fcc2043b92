#include "executor/context_parallel.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace ctx::exec {
namespace {
constexpr int kTagKv = 11, kTagDkv = 12;

TokenRefs refs(const std::vector<int64_t>& idx, const std::vector<int32_t>& doc) { return {idx.data(), doc.data()}; }

// The heads a Ulysses peer j receives: a slice of the query heads; of the KV heads either a slice
// or (degree above the KV heads) the one KV head its query heads read.
std::pair<int64_t, int64_t> head_range(int64_t j, int64_t u, int64_t heads, bool kv, int64_t q_heads) {
  if (!kv || heads >= u) return {j * heads / u, heads / u};
  int64_t group = q_heads / heads;  // query heads per KV head
  return {(j * q_heads / u) / group, 1};
}
}  // namespace

SequenceMeta make_sequence_meta(const ParallelContext& pc, const std::vector<const Sequence*>& batch) {
  SequenceMeta m;
  const Plan& p = pc.plan;
  if (batch.empty()) throw std::logic_error("make_sequence_meta: empty micro-batch");
  const int64_t seq = static_cast<int64_t>(batch[0]->tokens.size());
  // A micro-batch of mbs sequences runs as one: sequence b's token i has the global index b*seq + i
  // and its documents are renumbered past sequence b-1's, so no query sees another sequence's keys.
  // Every rank lays out its rows sequence by sequence, so the blocks below follow the same order.
  const int64_t doc_stride = seq + 1;
  auto indices = [&](int64_t cp_rank) {
    std::vector<int64_t> out;
    auto part = cp_token_indices(p, cp_rank, seq);
    for (size_t b = 0; b < batch.size(); ++b)
      for (int64_t i : part) out.push_back(static_cast<int64_t>(b) * seq + i);
    return out;
  };
  auto doc_of = [&](int64_t g) {
    const int64_t b = g / seq;
    return static_cast<int32_t>(batch[b]->doc[g % seq] + b * doc_stride);
  };
  m.local_index = indices(pc.coord.cp);
  for (int64_t g : m.local_index) {
    const Sequence& s = *batch[g / seq];
    const int64_t i = g % seq;
    m.tokens.push_back(s.tokens[i]);
    m.labels.push_back(s.labels[i]);
    m.doc.push_back(doc_of(g));
    m.pos.push_back(s.pos[i]);
  }
  auto add_block = [&](std::vector<int64_t> idx) {
    std::vector<int32_t> d;
    for (int64_t g : idx) d.push_back(doc_of(g));
    m.block_index.push_back(std::move(idx));
    m.block_doc.push_back(std::move(d));
  };
  if (p.cp_kind == CpKind::allgather && p.cp > 1) {
    for (int64_t c = 0; c < p.cp; ++c) add_block(indices(c));
    m.my_block = pc.coord.cp;
  } else {
    const int64_t u = ulysses_degree(p);
    for (int64_t r = 0; r < ring_degree(p); ++r) {  // the head layout: the Ulysses peers' rows in group order
      std::vector<int64_t> idx;
      for (int64_t ui = 0; ui < u; ++ui) {
        auto part = indices(r * u + ui);
        idx.insert(idx.end(), part.begin(), part.end());
      }
      add_block(std::move(idx));
    }
    m.my_block = pc.coord.ring;
  }
  return m;
}

AttnShape ContextAttention::shape() const {
  AttnShape s;
  s.q_heads = l_.attn_q_heads;
  s.kv_heads = l_.attn_kv_heads;
  s.head_dim = l_.head_dim;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(l_.head_dim)));
  return s;
}

Tensor ContextAttention::to_heads(const Tensor& x, int64_t heads, bool kv, Mem cat) {
  const int64_t u = l_.ulysses, T = l_.tokens, d = l_.head_dim;
  const int64_t per = kv ? l_.attn_kv_heads : l_.attn_q_heads;
  Tensor send = be_.alloc(u * T, per * d, Mem::comm_buffers);
  for (int64_t j = 0; j < u; ++j) {
    auto [h0, n] = head_range(j, u, heads, kv, l_.q_heads);
    be_.copy_block(send.data() + j * T * per * d, per * d, x.data() + h0 * d, heads * d, T, n * d);
  }
  Tensor out = be_.alloc(u * T, per * d, cat);
  pc_.ulysses->alltoall(send.data(), out.data(), T * per * d);
  return out;
}

void ContextAttention::to_sequence(const Tensor& xa, int64_t heads, bool kv, Tensor& out) {
  const int64_t u = l_.ulysses, T = l_.tokens, d = l_.head_dim;
  const int64_t per = kv ? l_.attn_kv_heads : l_.attn_q_heads;
  Tensor recv = be_.alloc(u * T, per * d, Mem::comm_buffers);
  pc_.ulysses->alltoall(xa.data(), recv.data(), T * per * d);
  be_.fill(out.data(), 0.0f, out.numel());
  for (int64_t j = 0; j < u; ++j) {  // replicated KV heads come back from several peers: their gradients add
    auto [h0, n] = head_range(j, u, heads, kv, l_.q_heads);
    be_.add_block(out.data() + h0 * d, heads * d, recv.data() + j * T * per * d, per * d, T, n * d);
  }
}

std::pair<Tensor, Tensor> ContextAttention::gather_kv(const float* k, const float* v) {
  const AttnShape sh = shape();
  const int64_t Ta = l_.attn_tokens, kvn = Ta * sh.kv_heads * sh.head_dim;
  Tensor kf = be_.alloc(pc_.plan.cp * Ta, sh.kv_heads * sh.head_dim, Mem::comm_buffers);
  Tensor vf = be_.alloc(pc_.plan.cp * Ta, sh.kv_heads * sh.head_dim, Mem::comm_buffers);
  pc_.cp->allgather(k, kf.data(), kvn);
  pc_.cp->allgather(v, vf.data(), kvn);
  return {std::move(kf), std::move(vf)};
}

void ContextAttention::core_forward(const SequenceMeta& s, const float* q, const float* k, const float* v, float* o,
                                    float* lse) {
  const AttnShape sh = shape();
  const int64_t Ta = l_.attn_tokens, kvn = Ta * sh.kv_heads * sh.head_dim;
  const auto& qi = s.block_index[s.my_block];
  const auto& qd = s.block_doc[s.my_block];
  const Plan& p = pc_.plan;
  if (p.cp_kind == CpKind::allgather && p.cp > 1) {
    auto [kf, vf] = gather_kv(k, v);
    for (int64_t c = 0; c < p.cp; ++c)
      be_.attention_forward_block(o, lse, q, refs(qi, qd), Ta, kf.data() + c * kvn, vf.data() + c * kvn,
                                  refs(s.block_index[c], s.block_doc[c]), Ta, sh);
    return;
  }
  const int64_t R = l_.ring, r = pc_.coord.ring;
  if (R == 1) {
    be_.attention_forward_block(o, lse, q, refs(qi, qd), Ta, k, v, refs(qi, qd), Ta, sh);
    return;
  }
  // ring: [K;V] packed so one message carries a block; double-buffered receive
  Tensor cur = be_.alloc(2, kvn, Mem::comm_buffers), next = be_.alloc(2, kvn, Mem::comm_buffers);
  be_.copy(cur.data(), k, kvn);
  be_.copy(cur.data() + kvn, v, kvn);
  const int next_rank = static_cast<int>((r + 1) % R), prev_rank = static_cast<int>((r + R - 1) % R);
  for (int64_t t = 0; t < R; ++t) {
    const int64_t src = (r - t + R) % R;
    std::unique_ptr<Request> rs, rr;
    if (t + 1 < R) {  // post the next block's transfer before computing on this one
      rr = pc_.ring->irecv(next.data(), 2 * kvn, prev_rank, kTagKv);
      rs = pc_.ring->isend(cur.data(), 2 * kvn, next_rank, kTagKv);
    }
    be_.attention_forward_block(o, lse, q, refs(qi, qd), Ta, cur.data(), cur.data() + kvn,
                                refs(s.block_index[src], s.block_doc[src]), Ta, sh);
    if (rr) { rr->wait(); rs->wait(); std::swap(cur, next); }
  }
}

void ContextAttention::core_backward(const SequenceMeta& s, const float* q, const float* k, const float* v,
                                     const float* dout, const float* lse, const float* delta, float* dq, float* dk,
                                     float* dv) {
  const AttnShape sh = shape();
  const int64_t Ta = l_.attn_tokens, kvn = Ta * sh.kv_heads * sh.head_dim;
  const auto& qi = s.block_index[s.my_block];
  const auto& qd = s.block_doc[s.my_block];
  const Plan& p = pc_.plan;
  if (p.cp_kind == CpKind::allgather && p.cp > 1) {
    auto [kf, vf] = gather_kv(k, v);
    Tensor dkf = be_.alloc(p.cp * Ta, sh.kv_heads * sh.head_dim, Mem::comm_buffers);
    Tensor dvf = be_.alloc(p.cp * Ta, sh.kv_heads * sh.head_dim, Mem::comm_buffers);
    for (int64_t c = 0; c < p.cp; ++c)
      be_.attention_backward_block(dq, dkf.data() + c * kvn, dvf.data() + c * kvn, q, refs(qi, qd), Ta,
                                   kf.data() + c * kvn, vf.data() + c * kvn, refs(s.block_index[c], s.block_doc[c]),
                                   Ta, dout, lse, delta, sh);
    pc_.cp->reduce_scatter(dkf.data(), dk, kvn);
    pc_.cp->reduce_scatter(dvf.data(), dv, kvn);
    return;
  }
  const int64_t R = l_.ring, r = pc_.coord.ring;
  if (R == 1) {
    be_.attention_backward_block(dq, dk, dv, q, refs(qi, qd), Ta, k, v, refs(qi, qd), Ta, dout, lse, delta, sh);
    return;
  }
  Tensor cur = be_.alloc(2, kvn, Mem::comm_buffers), next = be_.alloc(2, kvn, Mem::comm_buffers);
  Tensor dcur = be_.alloc(2, kvn, Mem::comm_buffers), dnext = be_.alloc(2, kvn, Mem::comm_buffers);
  be_.copy(cur.data(), k, kvn);
  be_.copy(cur.data() + kvn, v, kvn);
  const int next_rank = static_cast<int>((r + 1) % R), prev_rank = static_cast<int>((r + R - 1) % R);
  for (int64_t t = 0; t < R; ++t) {
    const int64_t src = (r - t + R) % R;
    std::unique_ptr<Request> rs, rr;
    if (t + 1 < R) {
      rr = pc_.ring->irecv(next.data(), 2 * kvn, prev_rank, kTagKv);
      rs = pc_.ring->isend(cur.data(), 2 * kvn, next_rank, kTagKv);
    }
    be_.attention_backward_block(dq, dcur.data(), dcur.data() + kvn, q, refs(qi, qd), Ta, cur.data(),
                                 cur.data() + kvn, refs(s.block_index[src], s.block_doc[src]), Ta, dout, lse, delta, sh);
    // this block's dK,dV travel on with it; after the last step they go home to their owner
    auto dr = pc_.ring->irecv(dnext.data(), 2 * kvn, prev_rank, kTagDkv);
    auto ds = pc_.ring->isend(dcur.data(), 2 * kvn, next_rank, kTagDkv);
    dr->wait();
    ds->wait();
    std::swap(dcur, dnext);
    if (rr) { rr->wait(); rs->wait(); std::swap(cur, next); }
  }
  be_.copy(dk, dcur.data(), kvn);
  be_.copy(dv, dcur.data() + kvn, kvn);
}

void ContextAttention::forward(const SequenceMeta& s, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& o,
                               Tensor& lse) {
  const int64_t Ta = l_.attn_tokens, hqa = l_.attn_q_heads, d = l_.head_dim;
  lse = be_.alloc(Ta, hqa, Mem::activations);
  be_.fill(lse.data(), -std::numeric_limits<float>::infinity(), lse.numel());
  if (l_.ulysses == 1) {
    o = be_.alloc(Ta, hqa * d, Mem::activations);
    core_forward(s, q.data(), k.data(), v.data(), o.data(), lse.data());
    return;
  }
  Tensor qa = to_heads(q, l_.q_heads, false, Mem::comm_buffers);
  Tensor ka = to_heads(k, l_.kv_heads, true, Mem::comm_buffers);
  Tensor va = to_heads(v, l_.kv_heads, true, Mem::comm_buffers);
  Tensor oa = be_.alloc(Ta, hqa * d, Mem::comm_buffers);
  o = be_.alloc(l_.tokens, l_.q_heads * d, Mem::activations);
  core_forward(s, qa.data(), ka.data(), va.data(), oa.data(), lse.data());
  qa.reset();  // the head-layout inputs are done with before the output travels back
  ka.reset();
  va.reset();
  to_sequence(oa, l_.q_heads, false, o);
}

void ContextAttention::backward(const SequenceMeta& s, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& o, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                                Tensor& dv) {
  const int64_t Ta = l_.attn_tokens, hqa = l_.attn_q_heads, hkva = l_.attn_kv_heads, d = l_.head_dim;
  const AttnShape sh = shape();
  Tensor delta = be_.alloc(Ta, hqa, Mem::workspace);
  if (l_.ulysses == 1) {
    be_.attention_delta(delta.data(), dout.data(), o.data(), Ta, sh);
    be_.fill(dq.data(), 0.0f, dq.numel());
    be_.fill(dk.data(), 0.0f, dk.numel());
    be_.fill(dv.data(), 0.0f, dv.numel());
    core_backward(s, q.data(), k.data(), v.data(), dout.data(), lse.data(), delta.data(), dq.data(), dk.data(),
                  dv.data());
    return;
  }
  Tensor qa = to_heads(q, l_.q_heads, false, Mem::comm_buffers);
  Tensor ka = to_heads(k, l_.kv_heads, true, Mem::comm_buffers);
  Tensor va = to_heads(v, l_.kv_heads, true, Mem::comm_buffers);
  Tensor oa = to_heads(o, l_.q_heads, false, Mem::comm_buffers);
  Tensor da = to_heads(dout, l_.q_heads, false, Mem::comm_buffers);
  be_.attention_delta(delta.data(), da.data(), oa.data(), Ta, sh);
  oa.reset();
  Tensor dqa = be_.alloc(Ta, hqa * d, Mem::workspace);
  Tensor dka = be_.alloc(Ta, hkva * d, Mem::workspace);
  Tensor dva = be_.alloc(Ta, hkva * d, Mem::workspace);
  core_backward(s, qa.data(), ka.data(), va.data(), da.data(), lse.data(), delta.data(), dqa.data(), dka.data(),
                dva.data());
  qa.reset();  // staging buffers released before the gradients' all-to-all allocates its own
  ka.reset();
  va.reset();
  da.reset();
  to_sequence(dqa, l_.q_heads, false, dq);
  to_sequence(dka, l_.kv_heads, true, dk);
  to_sequence(dva, l_.kv_heads, true, dv);
}

}  // namespace ctx::exec
