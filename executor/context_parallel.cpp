#include "executor/context_parallel.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

namespace ctx::exec {
namespace {
constexpr int kTagKv = 11, kTagDkv = 12;

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
  // each sequence's documents (runs of equal doc ids): cp_layout=headtail-doc cuts every one of them
  auto doc_lengths = [&](const Sequence& s) {
    std::vector<int64_t> lens;
    for (size_t i = 0; i < s.doc.size(); ++i) {
      if (i == 0 || s.doc[i] != s.doc[i - 1]) lens.push_back(0);
      ++lens.back();
    }
    return lens;
  };
  auto indices = [&](int64_t cp_rank) {
    std::vector<int64_t> out;
    for (size_t b = 0; b < batch.size(); ++b) {
      const std::vector<int64_t> docs = doc_lengths(*batch[b]);
      auto part = cp_token_indices(p, cp_rank, docs);
      // every rank's tensors hold seq/cp rows: a document whose length 2*cp does not divide would
      // give the ranks unequal shares (Transformer Engine pads each document to a multiple of 2*cp)
      if (static_cast<int64_t>(part.size()) * p.cp != seq)
        for (int64_t len : docs)
          if (len % (2 * p.cp) != 0)
            throw std::runtime_error("cp_layout=headtail-doc needs every document's length divisible by 2*cp = " +
                                     std::to_string(2 * p.cp) + "; sequence " + std::to_string(b) + " has a document of " +
                                     std::to_string(len) + " tokens (give mask=doc:<len> with len a multiple of 2*cp, or cp_layout=headtail)");
      for (int64_t i : part) out.push_back(static_cast<int64_t>(b) * seq + i);
    }
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
  if (p.cp_comm == CpComm::allgather && p.cp > 1) {
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
  const auto& qi = m.block_index[m.my_block];
  const auto& qd = m.block_doc[m.my_block];
  for (size_t b = 0; b < m.block_index.size(); ++b)
    m.kv_range.push_back(visible_hulls(qi, qd, m.block_index[b], m.block_doc[b]));
  return m;
}

std::vector<int32_t> visible_hulls(const std::vector<int64_t>& q_index, const std::vector<int32_t>& q_doc,
                                   const std::vector<int64_t>& k_index, const std::vector<int32_t>& k_doc) {
  // per document: its keys sorted by global index, with the running min and max of their rows
  struct Keys {
    std::vector<int64_t> index;
    std::vector<int32_t> lo, hi;
  };
  std::map<int32_t, std::vector<std::pair<int64_t, int32_t>>> by_doc;
  for (size_t j = 0; j < k_index.size(); ++j) by_doc[k_doc[j]].push_back({k_index[j], static_cast<int32_t>(j)});
  std::map<int32_t, Keys> keys;
  for (auto& [doc, list] : by_doc) {
    std::sort(list.begin(), list.end());
    Keys k;
    int32_t lo = std::numeric_limits<int32_t>::max(), hi = -1;
    for (auto& [idx, row] : list) {
      lo = std::min(lo, row);
      hi = std::max(hi, row);
      k.index.push_back(idx);
      k.lo.push_back(lo);
      k.hi.push_back(hi + 1);
    }
    keys[doc] = std::move(k);
  }
  std::vector<int32_t> out(2 * q_index.size(), 0);
  for (size_t i = 0; i < q_index.size(); ++i) {
    auto it = keys.find(q_doc[i]);
    if (it == keys.end()) continue;
    const Keys& k = it->second;
    const size_t n = std::upper_bound(k.index.begin(), k.index.end(), q_index[i]) - k.index.begin();
    if (n == 0) continue;
    out[2 * i] = k.lo[n - 1];
    out[2 * i + 1] = k.hi[n - 1];
  }
  return out;
}

DeviceBatch upload_batch(Backend& be, const SequenceMeta& s) {
  DeviceBatch b;
  auto ints = [&](const std::vector<int32_t>& v) {
    Tensor t = be.alloc(static_cast<int64_t>(v.size()), 1, DType::i32, Mem::mask);
    be.upload(t, v.data());
    return t;
  };
  auto longs = [&](const std::vector<int64_t>& v) {
    Tensor t = be.alloc(static_cast<int64_t>(v.size()), 1, DType::i64, Mem::mask);
    be.upload(t, v.data());
    return t;
  };
  b.tokens = ints(s.tokens);
  b.labels = ints(s.labels);
  b.pos = ints(s.pos);
  b.q_index = longs(s.block_index[s.my_block]);
  b.q_doc = ints(s.block_doc[s.my_block]);
  for (size_t k = 0; k < s.block_index.size(); ++k) {
    b.k_index.push_back(longs(s.block_index[k]));
    b.k_doc.push_back(ints(s.block_doc[k]));
    Tensor r = be.alloc(static_cast<int64_t>(s.kv_range[k].size() / 2), 2, DType::i32, Mem::mask);
    be.upload(r, s.kv_range[k].data());
    b.kv_range.push_back(std::move(r));
  }
  b.my_block = s.my_block;
  for (int32_t l : s.labels) b.valid_labels += (l >= 0);
  return b;
}

AttnShape ContextAttention::shape() const {
  AttnShape s;
  s.q_heads = l_.attn_q_heads;
  s.kv_heads = l_.attn_kv_heads;
  s.head_dim = l_.head_dim;
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(l_.head_dim)));
  return s;
}

int64_t ContextAttention::key_blocks() const {
  return pc_.plan.cp_comm == CpComm::allgather ? pc_.plan.cp : l_.ring;
}

View ContextAttention::accumulator(View out, Tensor& hold) {
  if (out.dtype() == DType::f32) {
    be_.zero(out);
    return out;
  }
  hold = be_.alloc(out.rows(), out.cols(), DType::f32, Mem::workspace);
  be_.zero(hold);
  return hold;
}

void ContextAttention::finish(View out, Tensor& hold) {
  if (!hold) return;
  be_.copy(out, hold);
  hold.reset();
}

Tensor ContextAttention::to_heads(View x, int64_t heads, bool kv, Mem cat) {
  const int64_t u = l_.ulysses, T = l_.tokens, d = l_.head_dim;
  const int64_t per = kv ? l_.attn_kv_heads : l_.attn_q_heads;
  Tensor send = be_.alloc(u * T, per * d, x.dtype(), Mem::comm_buffers);
  for (int64_t j = 0; j < u; ++j) {
    auto [h0, n] = head_range(j, u, heads, kv, l_.q_heads);
    be_.copy_cols(send.row_range(j * T, T), 0, x, h0 * d, n * d);
  }
  Tensor out = be_.alloc(u * T, per * d, x.dtype(), cat);
  pc_.ulysses->alltoall(send, out);
  return out;
}

void ContextAttention::to_sequence(View xa, int64_t heads, bool kv, View out) {
  const int64_t u = l_.ulysses, T = l_.tokens, d = l_.head_dim;
  const int64_t per = kv ? l_.attn_kv_heads : l_.attn_q_heads;
  Tensor recv = be_.alloc(u * T, per * d, xa.dtype(), Mem::comm_buffers);
  pc_.ulysses->alltoall(xa, recv);
  if (kv && heads < u) be_.zero(out);  // replicated KV heads come back from several peers: their gradients add
  for (int64_t j = 0; j < u; ++j) {
    auto [h0, n] = head_range(j, u, heads, kv, l_.q_heads);
    if (kv && heads < u) be_.add_cols(out, h0 * d, recv.row_range(j * T, T), 0, n * d);
    else be_.copy_cols(out, h0 * d, recv.row_range(j * T, T), 0, n * d);
  }
}

std::pair<Tensor, Tensor> ContextAttention::gather_kv(View k, View v) {
  const int64_t Ta = l_.attn_tokens, kvd = k.cols();
  Tensor kf = be_.alloc(pc_.plan.cp * Ta, kvd, k.dtype(), Mem::comm_buffers);
  Tensor vf = be_.alloc(pc_.plan.cp * Ta, kvd, v.dtype(), Mem::comm_buffers);
  pc_.cp->allgather(k, kf);
  pc_.cp->allgather(v, vf);
  return {std::move(kf), std::move(vf)};
}

void ContextAttention::core_forward(const DeviceBatch& b, View q, View k, View v, View o, View lse) {
  const AttnShape sh = shape();
  const int64_t Ta = l_.attn_tokens;
  const TokenRefs qt = b.queries();
  const Plan& p = pc_.plan;
  const char* task = pc_.trace.pass == SimPass::recompute ? "attention_recompute" : "attention";
  if (p.cp_comm == CpComm::allgather && p.cp > 1) {
    pc_.trace.add("kv_all_gather", SimStream::tp);
    auto [kf, vf] = gather_kv(k, v);
    pc_.trace.add(task, SimStream::compute);
    for (int64_t c = 0; c < p.cp; ++c)
      be_.attention_forward_block(o, lse, q, qt, kf.row_range(c * Ta, Ta), vf.row_range(c * Ta, Ta), b.block(c), sh);
    return;
  }
  const int64_t R = l_.ring, r = pc_.coord.ring;
  if (R == 1) {
    pc_.trace.add(task, SimStream::compute);
    be_.attention_forward_block(o, lse, q, qt, k, v, b.block(b.my_block), sh);
    return;
  }
  // ring: [K; V] packed so one message carries a block; double-buffered receive
  Tensor cur = be_.alloc(2 * Ta, k.cols(), k.dtype(), Mem::comm_buffers);
  Tensor next = be_.alloc(2 * Ta, k.cols(), k.dtype(), Mem::comm_buffers);
  be_.copy(cur.row_range(0, Ta), k);
  be_.copy(cur.row_range(Ta, Ta), v);
  const int next_rank = static_cast<int>((r + 1) % R), prev_rank = static_cast<int>((r + R - 1) % R);
  for (int64_t t = 0; t < R; ++t) {
    const int64_t src = (r - t + R) % R;
    std::unique_ptr<Request> rs, rr;
    if (t + 1 < R) {  // post the next block's transfer before computing on this one
      pc_.trace.add("ring_kv", SimStream::ring);
      rr = pc_.ring->irecv(next, prev_rank, kTagKv);
      rs = pc_.ring->isend(cur, next_rank, kTagKv);
    }
    pc_.trace.add(task, SimStream::compute);
    be_.attention_forward_block(o, lse, q, qt, cur.row_range(0, Ta), cur.row_range(Ta, Ta), b.block(src), sh);
    if (rr) { rr->wait(); rs->wait(); std::swap(cur, next); }
  }
}

void ContextAttention::core_backward(const DeviceBatch& b, View q, View k, View v, View dout, View lse, View delta,
                                     View dq, View dk, View dv) {
  const AttnShape sh = shape();
  const int64_t Ta = l_.attn_tokens, kvd = k.cols();
  const TokenRefs qt = b.queries();
  const Plan& p = pc_.plan;
  if (p.cp_comm == CpComm::allgather && p.cp > 1) {
    pc_.trace.add("kv_all_gather", SimStream::tp);
    auto [kf, vf] = gather_kv(k, v);
    pc_.trace.add("attention_bwd", SimStream::compute);
    Tensor dkf = be_.alloc(p.cp * Ta, kvd, DType::f32, Mem::comm_buffers);
    Tensor dvf = be_.alloc(p.cp * Ta, kvd, DType::f32, Mem::comm_buffers);
    be_.zero(dkf);
    be_.zero(dvf);
    for (int64_t c = 0; c < p.cp; ++c)
      be_.attention_backward_block(dq, dkf.row_range(c * Ta, Ta), dvf.row_range(c * Ta, Ta), q, qt,
                                   kf.row_range(c * Ta, Ta), vf.row_range(c * Ta, Ta), b.block(c), dout, lse, delta, sh);
    pc_.trace.add("dkv_reduce_scatter", SimStream::tp);
    pc_.cp->reduce_scatter(dkf, dk);
    pc_.cp->reduce_scatter(dvf, dv);
    return;
  }
  const int64_t R = l_.ring, r = pc_.coord.ring;
  if (R == 1) {
    pc_.trace.add("attention_bwd", SimStream::compute);
    be_.attention_backward_block(dq, dk, dv, q, qt, k, v, b.block(b.my_block), dout, lse, delta, sh);
    return;
  }
  // K,V travel as in the forward. A block's dK,dV (fp32) travel with it: step t computes this
  // rank's contribution into `blk`; the accumulated dK,dV of the same block, sent by the previous
  // rank after its step t-1, is awaited only after that compute (so its hop overlaps it), summed,
  // and sent on; after the last step the block's total comes home to its owner.
  Tensor cur = be_.alloc(2 * Ta, kvd, k.dtype(), Mem::comm_buffers);
  Tensor next = be_.alloc(2 * Ta, kvd, k.dtype(), Mem::comm_buffers);
  Tensor acc = be_.alloc(2 * Ta, kvd, DType::f32, Mem::comm_buffers);   // being sent on
  Tensor in = be_.alloc(2 * Ta, kvd, DType::f32, Mem::comm_buffers);    // being received
  Tensor blk = be_.alloc(2 * Ta, kvd, DType::f32, Mem::comm_buffers);   // this step's contribution
  be_.copy(cur.row_range(0, Ta), k);
  be_.copy(cur.row_range(Ta, Ta), v);
  const int next_rank = static_cast<int>((r + 1) % R), prev_rank = static_cast<int>((r + R - 1) % R);
  std::unique_ptr<Request> dr, ds;
  for (int64_t t = 0; t < R; ++t) {
    const int64_t src = (r - t + R) % R;
    std::unique_ptr<Request> rs, rr;
    if (t + 1 < R) {
      pc_.trace.add("ring_kv", SimStream::ring);
      rr = pc_.ring->irecv(next, prev_rank, kTagKv);
      rs = pc_.ring->isend(cur, next_rank, kTagKv);
    }
    pc_.trace.add("attention_bwd", SimStream::compute);
    View mine = t == 0 ? View(acc) : View(blk);  // the owner starts the block's sum
    be_.zero(mine);
    be_.attention_backward_block(dq, mine.row_range(0, Ta), mine.row_range(Ta, Ta), q, qt, cur.row_range(0, Ta),
                                 cur.row_range(Ta, Ta), b.block(src), dout, lse, delta, sh);
    if (t > 0) {  // the block's dK,dV so far (arrived during the compute), plus this rank's part
      dr->wait();
      ds->wait();
      be_.axpy(in, 1.0f, blk);
      std::swap(acc, in);
    }
    pc_.trace.add("ring_dkv", SimStream::ring);
    dr = pc_.ring->irecv(in, prev_rank, kTagDkv);
    ds = pc_.ring->isend(acc, next_rank, kTagDkv);
    if (rr) { rr->wait(); rs->wait(); std::swap(cur, next); }
  }
  dr->wait();  // this rank's own block, summed over the ring
  ds->wait();
  pc_.trace.add("ring_dkv_sum", SimStream::compute);
  be_.copy(dk, in.row_range(0, Ta));
  be_.copy(dv, in.row_range(Ta, Ta));
}

void ContextAttention::gradients(const DeviceBatch& b, View q, View k, View v, View dout, View lse, View delta, View dq,
                                 View dk, View dv) {
  Tensor hq;
  View aq = accumulator(dq, hq);
  be_.zero(dk);
  be_.zero(dv);
  core_backward(b, q, k, v, dout, lse, delta, aq, dk, dv);
  finish(dq, hq);
}

void ContextAttention::forward(const DeviceBatch& b, View q, View k, View v, Tensor& o, Tensor& lse) {
  ++forward_calls_;
  const int64_t Ta = l_.attn_tokens, hqa = l_.attn_q_heads, d = l_.head_dim;
  lse = be_.alloc(Ta, hqa, DType::f32, Mem::activations);
  be_.fill(lse, -std::numeric_limits<float>::infinity());
  const bool merged = key_blocks() > 1;  // several blocks merge into the output: fp32 accumulator under bf16
  if (l_.ulysses == 1) {
    o = be_.alloc(Ta, hqa * d, q.dtype(), Mem::activations);
    Tensor acc;
    View out = merged ? accumulator(o, acc) : View(o);
    if (!merged) be_.zero(o);
    core_forward(b, q, k, v, out, lse);
    finish(o, acc);
    return;
  }
  pc_.trace.add("ulysses_a2a_qkv", SimStream::tp);
  Tensor qa = to_heads(q, l_.q_heads, false, Mem::comm_buffers);
  Tensor ka = to_heads(k, l_.kv_heads, true, Mem::comm_buffers);
  Tensor va = to_heads(v, l_.kv_heads, true, Mem::comm_buffers);
  Tensor oa = be_.alloc(Ta, hqa * d, q.dtype(), Mem::comm_buffers);
  o = be_.alloc(l_.tokens, l_.q_heads * d, q.dtype(), Mem::activations);
  Tensor acc;
  View out = merged ? accumulator(oa, acc) : View(oa);
  if (!merged) be_.zero(oa);
  core_forward(b, qa, ka, va, out, lse);
  finish(oa, acc);
  qa.reset();  // the head-layout inputs are done with before the output travels back
  ka.reset();
  va.reset();
  pc_.trace.add("ulysses_a2a_out", SimStream::tp);
  to_sequence(oa, l_.q_heads, false, o);
}

void ContextAttention::backward(const DeviceBatch& b, View q, View k, View v, View o, View lse, View dout, View dq,
                                View dk, View dv) {
  const int64_t Ta = l_.attn_tokens, hqa = l_.attn_q_heads, hkva = l_.attn_kv_heads, d = l_.head_dim;
  const AttnShape sh = shape();
  Tensor delta = be_.alloc(Ta, hqa, DType::f32, Mem::workspace);
  if (l_.ulysses == 1) {
    be_.attention_delta(delta, dout, o, sh);
    gradients(b, q, k, v, dout, lse, delta, dq, dk, dv);
    return;
  }
  pc_.trace.add("ulysses_a2a_out", SimStream::tp);  // d(out) (with q, k, v, o) to the head layout
  Tensor qa = to_heads(q, l_.q_heads, false, Mem::comm_buffers);
  Tensor ka = to_heads(k, l_.kv_heads, true, Mem::comm_buffers);
  Tensor va = to_heads(v, l_.kv_heads, true, Mem::comm_buffers);
  Tensor oa = to_heads(o, l_.q_heads, false, Mem::comm_buffers);
  Tensor da = to_heads(dout, l_.q_heads, false, Mem::comm_buffers);
  be_.attention_delta(delta, da, oa, sh);
  oa.reset();
  Tensor dqa = be_.alloc(Ta, hqa * d, q.dtype(), Mem::workspace);
  Tensor dka = be_.alloc(Ta, hkva * d, q.dtype(), Mem::workspace);
  Tensor dva = be_.alloc(Ta, hkva * d, q.dtype(), Mem::workspace);
  gradients(b, qa, ka, va, da, lse, delta, dqa, dka, dva);
  qa.reset();  // staging buffers released before the gradients' all-to-all allocates its own
  ka.reset();
  va.reset();
  da.reset();
  pc_.trace.add("ulysses_a2a_qkv", SimStream::tp);
  to_sequence(dqa, l_.q_heads, false, dq);
  to_sequence(dka, l_.kv_heads, true, dk);
  to_sequence(dva, l_.kv_heads, true, dv);
}

}  // namespace ctx::exec
