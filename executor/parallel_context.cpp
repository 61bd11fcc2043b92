#include "executor/parallel_context.hpp"

#include <algorithm>

namespace ctx::exec {

ParallelContext make_parallel_context(CommWorld& w, const Plan& plan) {
  ParallelContext c;
  c.plan = plan;
  c.world_comm = &w.world();
  c.rank = w.world().rank();
  c.world = w.world().size();
  c.coord = coord_of_rank(plan, c.rank);
  c.tp = w.split(group_ranks(plan, Group::tp, c.rank));
  c.cp = w.split(group_ranks(plan, Group::cp, c.rank));
  c.dp = w.split(group_ranks(plan, Group::dp, c.rank));
  c.ulysses = w.split(group_ranks(plan, Group::ulysses, c.rank));
  c.ring = w.split(group_ranks(plan, Group::ring, c.rank));
  c.zero = w.split(group_ranks(plan, Group::zero, c.rank));
  return c;
}

Layout make_layout(const ModelSpec& m, const Plan& p, int64_t tp_rank, int64_t seq) {
  Layout l;
  l.layers = m.layers;
  l.hidden = m.hidden;
  l.head_dim = m.head_dim;
  l.vocab = m.vocab;
  l.q_heads = m.heads / p.tp;
  if (m.kv_heads >= p.tp) {
    l.kv_heads = m.kv_heads / p.tp;
    l.kv_head0 = tp_rank * l.kv_heads;
    l.kv_replicas = 1;
  } else {  // each KV head replicated on tp/kv_heads consecutive TP ranks (the ranks of its query heads)
    l.kv_heads = 1;
    l.kv_replicas = p.tp / m.kv_heads;
    l.kv_head0 = tp_rank / l.kv_replicas;
  }
  l.ffn = m.ffn / p.tp;
  l.vocab_rows = (m.vocab + p.tp - 1) / p.tp;
  l.vocab0 = tp_rank * l.vocab_rows;
  l.vocab_valid = std::clamp<int64_t>(m.vocab - l.vocab0, 0, l.vocab_rows);
  l.seq = seq;
  l.tokens = std::max<int64_t>(1, p.mbs) * seq / p.cp;  // a micro-batch runs as one: mbs sequences
  l.sp = sp_enabled(p) && p.tp > 1;
  l.tokens_sp = l.sp ? l.tokens / p.tp : l.tokens;
  l.ulysses = ulysses_degree(p);
  l.ring = ring_degree(p);
  l.attn_q_heads = l.q_heads / l.ulysses;
  l.attn_kv_heads = l.kv_heads >= l.ulysses ? l.kv_heads / l.ulysses : 1;
  l.attn_tokens = l.tokens * l.ulysses;
  return l;
}

std::vector<int64_t> cp_token_indices(const Plan& p, int64_t c, int64_t seq) {
  std::vector<int64_t> out;
  auto chunk = [&](int64_t begin, int64_t len) {
    for (int64_t i = 0; i < len; ++i) out.push_back(begin + i);
  };
  const int64_t cp = p.cp;
  if (cp == 1) { chunk(0, seq); return out; }
  switch (p.cp_kind) {
    case CpKind::zigzag: {
      int64_t len = seq / (2 * cp);
      chunk(c * len, len);
      chunk((2 * cp - 1 - c) * len, len);
      break;
    }
    case CpKind::usp: {
      int64_t u = ulysses_degree(p), r = ring_degree(p);
      int64_t ring_index = c / u, ui = c % u;
      std::vector<int64_t> set;
      if (r == 1) {
        for (int64_t i = 0; i < seq; ++i) set.push_back(i);
      } else {
        int64_t len = seq / (2 * r);
        for (int64_t i = 0; i < len; ++i) set.push_back(ring_index * len + i);
        for (int64_t i = 0; i < len; ++i) set.push_back((2 * r - 1 - ring_index) * len + i);
      }
      int64_t slice = static_cast<int64_t>(set.size()) / u;
      out.assign(set.begin() + ui * slice, set.begin() + (ui + 1) * slice);
      break;
    }
    default:
      chunk(c * (seq / cp), seq / cp);
  }
  return out;
}

std::string executor_plan_problem(const ModelSpec& m, const Plan& p, int64_t seq) {
  const int64_t tokens = seq / p.cp;
  if (seq % p.cp != 0) return "the sequence (" + std::to_string(seq) + ") must split evenly over cp=" + std::to_string(p.cp);
  if (sp_enabled(p) && p.tp > 1 && tokens % p.tp != 0)
    return "sequence parallel splits each rank's " + std::to_string(tokens) + " tokens over tp=" + std::to_string(p.tp) +
           ": they must divide evenly";
  if (m.norm != NormKind::rmsnorm || m.activation != ActivationKind::swiglu)
    return "ctxrun trains Llama-style models (RMSNorm + SwiGLU); model " + m.name + " has " + to_string(m.norm) + " + " +
           to_string(m.activation);
  if (m.qkv_bias || m.qk_norm) return "ctxrun does not implement qkv_bias or qk_norm yet (model " + m.name + ")";
  for (auto k : m.layer_position)
    if (k == PositionKind::alibi) return "ctxrun does not implement ALiBi (model " + m.name + ")";
  if (m.head_dim > 1024) return "head_dim above 1024 is not supported by the CPU attention kernel";
  if (p.precision != Precision::bf16) return "the CPU backend computes in float32; precision=fp8 needs the CUDA backend";
  if (p.mask == MaskKind::explicit_mask) return "ctxrun never materialises an s x s mask; use mask=causal or mask=doc:...";
  return "";
}

}  // namespace ctx::exec
