#include "executor/parallel_context.hpp"

#include "costmodel/plan_check.hpp"

#include <algorithm>

namespace ctx::exec {

ParallelContext make_parallel_context(CommWorld& w, Backend& be, const Plan& plan) {
  ParallelContext c;
  c.plan = plan;
  c.rank = w.world().rank();
  c.world = w.world().size();
  c.coord = coord_of_rank(plan, c.rank);
  auto group = [&](Group g) { return be.make_comm(w.split(group_ranks(plan, g, c.rank))); };
  c.tp = group(Group::tp);
  c.cp = group(Group::cp);
  c.dp = group(Group::dp);
  c.ulysses = group(Group::ulysses);
  c.ring = group(Group::ring);
  c.zero = group(Group::zero);
  c.zero_shard = group(Group::zero_shard);
  c.zero_replicate = group(Group::zero_replicate);
  std::vector<int64_t> everyone(static_cast<size_t>(c.world));
  for (int64_t r = 0; r < c.world; ++r) everyone[r] = r;
  c.all = be.make_comm(w.split(everyone));
  c.world_comm = c.all.get();
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
  l.act = p.precision == Precision::fp32 ? DType::f32 : DType::bf16;
  return l;
}

std::string executor_plan_problem(const ModelSpec& m, const Plan& p, int64_t seq) {
  if (p.pad && padded_seq(p, seq) != seq) {
    const int64_t g = seq_granule(p), down = seq / g * g;
    return "ctxrun does not pad sequences: pad=1 would pad " + std::to_string(seq) + " tokens to " +
           std::to_string(padded_seq(p, seq)) + " (ctxplan prices the padding); valid here: pad=0 with --seq a multiple of " +
           std::to_string(g) + (down > 0 ? " (" + std::to_string(down) + " or " : " (") + std::to_string(down + g) + ")";
  }
  if (p.pp > 1 || p.vpp > 1)
    return "ctxrun does not run pipeline parallelism yet (pp=" + std::to_string(p.pp) + ", vpp=" + std::to_string(p.vpp) +
           "); valid: pp=1 (ctxplan predicts pp>1 plans; spread the layers with tp, cp or zero=3 to run them here)";
  if (p.tp_overlap)
    return "ctxrun runs its tensor-parallel collectives between the GEMMs (no userbuffers overlap): tp_overlap=1 is "
           "priced by ctxplan (Megatron's --tp-comm-overlap) but not executed; valid: tp_overlap=0";
  if (p.compile != Compile::off)
    return std::string("ctxrun runs eager kernels (no torch.compile): compile=") + to_string(p.compile) +
           " is priced by ctxplan for torchtitan but not executed; valid: compile=off";
  if (p.mask == MaskKind::document && p.cp > 1 && !(p.cp_varlen == CpVarlen{}))
    return "ctxrun runs packed documents as one varlen ring (cp_varlen=native); cp_varlen=" + to_string(p.cp_varlen) +
           " (the ring per document or per sub-pack) is priced by ctxplan but not executed yet; valid: cp_varlen=native";
  if (p.cp > 1 && p.cp_layout == CpLayout::headtail_doc && p.cp_comm != CpComm::a2a) {
    // every rank holds seq/cp rows only when 2*cp divides every document (Transformer Engine pads them)
    const int64_t g = 2 * p.cp;
    const bool fixed = p.mask == MaskKind::document && p.docs.kind == DocLengths::Kind::fixed && !p.docs.tokens.empty();
    const int64_t len = fixed ? std::min(p.docs.tokens[0], seq) : 0;
    if (!fixed || len % g != 0 || (seq % len) % g != 0)
      return "cp_layout=headtail-doc cuts every document in 2*cp = " + std::to_string(g) +
             " chunks; ctxrun runs it with mask=doc:<len> where 2*cp divides len and the last document (seq % len), got mask=" +
             mask_to_string(p) + " at seq " + std::to_string(seq);
  }
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
  if (p.precision == Precision::fp8) return "ctxrun runs precision=bf16 or fp32; fp8 is not implemented";
  if (p.moments == StateDtype::q8) return "ctxrun stores Adam's moments in fp32 or bf16; moments=8bit is priced, not executed; valid: moments=fp32|bf16";
  if (p.grads == StateDtype::bf16) return "ctxrun accumulates gradients in fp32; grads=bf16 is priced, not executed; valid: grads=fp32";
  if (p.mask == MaskKind::explicit_mask) return "ctxrun never materialises an s x s mask; use mask=causal or mask=doc:...";
  return "";
}

}  // namespace ctx::exec
