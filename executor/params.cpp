#include "executor/params.hpp"

#include <cmath>
#include <random>
#include <stdexcept>

#include "costmodel/errors.hpp"

namespace ctx::exec {
namespace {

uint64_t fnv1a(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : s) { h ^= c; h *= 1099511628211ull; }
  return h;
}

// Deterministic full-size initial value of one named tensor: the same for every plan.
std::vector<float> init_full(const ParamInfo& p, int64_t layers, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(p.full_rows * p.full_cols));
  if (!p.decay) {  // norm weights start at one
    std::fill(out.begin(), out.end(), 1.0f);
    return out;
  }
  // normal(0, 0.02); residual projections scaled by 1/sqrt(2 layers) (GPT-2 / llm.c)
  double std = 0.02;
  if (p.name.find("o_proj") != std::string::npos || p.name.find("down_proj") != std::string::npos)
    std /= std::sqrt(2.0 * static_cast<double>(layers));
  std::mt19937_64 rng(fnv1a(p.name, seed));
  const double two_pi = 6.283185307179586;
  for (size_t i = 0; i < out.size(); i += 2) {  // Box-Muller: portable across standard libraries
    double u1 = (static_cast<double>(rng() >> 11) + 1.0) / 9007199254740993.0;
    double u2 = static_cast<double>(rng() >> 11) / 9007199254740992.0;
    double r = std::sqrt(-2.0 * std::log(u1));
    out[i] = static_cast<float>(std * r * std::cos(two_pi * u2));
    if (i + 1 < out.size()) out[i + 1] = static_cast<float>(std * r * std::sin(two_pi * u2));
  }
  return out;
}

int64_t kv_head0_of(const Layout& l, int64_t tp_rank) {
  return l.kv_replicas > 1 ? tp_rank / l.kv_replicas : tp_rank * l.kv_heads;
}

// This TP rank's slice of a full tensor.
void slice_local(const ParamInfo& p, const float* full, float* local, int64_t tp_rank, int64_t kv_head0,
                 int64_t head_dim) {
  for (int64_t r = 0; r < p.rows; ++r) {
    for (int64_t c = 0; c < p.cols; ++c) {
      int64_t fr = r, fc = c;
      switch (p.split) {
        case TpSplit::replicated: break;
        case TpSplit::rows: fr = tp_rank * p.rows + r; break;
        case TpSplit::cols: fc = tp_rank * p.cols + c; break;
        case TpSplit::kv_rows: fr = kv_head0 * head_dim + r; break;
      }
      local[r * p.cols + c] = fr < p.full_rows ? full[fr * p.full_cols + fc] : 0.0f;
    }
  }
}

}  // namespace

int ParamUnit::find(const std::string& n) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == n) return static_cast<int>(i);
  return -1;
}

float learning_rate(const OptimizerConfig& c, int64_t step) {
  if (c.warmup > 0 && step <= c.warmup) return c.lr * static_cast<float>(step) / static_cast<float>(c.warmup);
  if (step >= c.total_steps) return c.min_lr;
  double t = static_cast<double>(step - c.warmup) / static_cast<double>(std::max<int64_t>(1, c.total_steps - c.warmup));
  return c.min_lr + static_cast<float>(0.5 * (1.0 + std::cos(3.14159265358979323846 * t))) * (c.lr - c.min_lr);
}

ParamStore::ParamStore(Backend& be, ParallelContext& pc, const ModelSpec& m, const Layout& l, uint64_t seed)
    : be_(be), pc_(pc), l_(l), zero_(pc.plan.zero) {
  const Plan& plan = pc.plan;
  const int64_t tp = plan.tp, t = pc.coord.tp, h = m.hidden, d = m.head_dim;
  shard_degree_ = zero_ >= 1 ? pc.zero->size() : 1;
  auto add = [&](ParamUnit& u, std::string name, int64_t fr, int64_t fc, TpSplit split, bool is_norm) {
    ParamInfo p;
    p.name = std::move(name);
    p.full_rows = fr;
    p.full_cols = fc;
    p.split = split;
    p.rows = fr;
    p.cols = fc;
    if (split == TpSplit::rows) p.rows = (fr + tp - 1) / tp;
    if (split == TpSplit::cols) p.cols = fc / tp;
    if (split == TpSplit::kv_rows) p.rows = l.kv_heads * d;
    p.decay = !is_norm;
    if (split == TpSplit::replicated) p.counted_here = (t == 0);
    if (split == TpSplit::kv_rows && l.kv_replicas > 1) p.counted_here = (t % l.kv_replicas == 0);
    p.grad_partial_over_tp = is_norm && l.sp;
    p.offset = u.numel;
    u.numel += p.numel();
    u.params.push_back(p);
  };
  ParamUnit emb;
  emb.name = "embedding";
  add(emb, "model.embed_tokens.weight", m.vocab, h, TpSplit::rows, false);
  units.push_back(std::move(emb));
  for (int64_t i = 0; i < m.layers; ++i) {
    ParamUnit u;
    std::string pre = "model.layers." + std::to_string(i) + ".";
    u.name = "layer " + std::to_string(i);
    add(u, pre + "input_layernorm.weight", 1, h, TpSplit::replicated, true);
    add(u, pre + "self_attn.q_proj.weight", q_dim(m), h, TpSplit::rows, false);
    add(u, pre + "self_attn.k_proj.weight", kv_dim(m), h, TpSplit::kv_rows, false);
    add(u, pre + "self_attn.v_proj.weight", kv_dim(m), h, TpSplit::kv_rows, false);
    add(u, pre + "self_attn.o_proj.weight", h, q_dim(m), TpSplit::cols, false);
    add(u, pre + "post_attention_layernorm.weight", 1, h, TpSplit::replicated, true);
    add(u, pre + "mlp.gate_proj.weight", m.ffn, h, TpSplit::rows, false);
    add(u, pre + "mlp.up_proj.weight", m.ffn, h, TpSplit::rows, false);
    add(u, pre + "mlp.down_proj.weight", h, m.ffn, TpSplit::cols, false);
    units.push_back(std::move(u));
  }
  ParamUnit fin;
  fin.name = "final";
  add(fin, "model.norm.weight", 1, h, TpSplit::replicated, true);
  if (!m.tied_embeddings) add(fin, "lm_head.weight", m.vocab, h, TpSplit::rows, false);
  units.push_back(std::move(fin));

  const bool host_opt = plan.opt_offload, host_params = plan.param_offload;
  for (auto& u : units) {
    u.padded = (u.numel + shard_degree_ - 1) / shard_degree_ * shard_degree_;
    u.shard = u.padded / shard_degree_;
    u.shard_offset = shard_degree_ > 1 ? pc.zero->rank() * u.shard : 0;
    std::vector<float> local(static_cast<size_t>(u.padded), 0.0f);
    for (auto& p : u.params) {
      auto full = init_full(p, m.layers, seed);
      slice_local(p, full.data(), local.data() + p.offset, t, kv_head0_of(l, t), d);
    }
    u.master = host_opt ? be_.alloc_host(1, u.shard, HostMem::master_weights) : be_.alloc(1, u.shard, Mem::master_weights);
    u.m = host_opt ? be_.alloc_host(1, u.shard, HostMem::optimizer) : be_.alloc(1, u.shard, Mem::optimizer);
    u.v = host_opt ? be_.alloc_host(1, u.shard, HostMem::optimizer) : be_.alloc(1, u.shard, Mem::optimizer);
    be_.copy(u.master.data(), local.data() + u.shard_offset, u.shard);
    if (zero_ == 3) {
      u.w_shard = host_params ? be_.alloc_host(1, u.shard, HostMem::weights) : be_.alloc(1, u.shard, Mem::weights);
      be_.copy(u.w_shard.data(), local.data() + u.shard_offset, u.shard);
    } else {
      u.w = be_.alloc(1, u.padded, Mem::weights);
      be_.copy(u.w.data(), local.data(), u.padded);
    }
    if (zero_ >= 2) u.g_shard = be_.alloc(1, u.shard, Mem::grads);
    else u.g = be_.alloc(1, u.padded, Mem::grads);
  }
}

void ParamStore::acquire_weights(int64_t ui) {
  ParamUnit& u = units[ui];
  if (zero_ != 3 || u.w) return;
  u.w = be_.alloc(1, u.padded, Mem::comm_buffers);
  pc_.zero->allgather(u.w_shard.data(), u.w.data(), u.shard);
}

void ParamStore::release_weights(int64_t ui) {
  if (zero_ == 3) units[ui].w.reset();
}

void ParamStore::acquire_grads(int64_t ui) {
  ParamUnit& u = units[ui];
  if (zero_ >= 2 && !u.g) u.g = be_.alloc(1, u.padded, Mem::comm_buffers);
}

float* ParamStore::grad(int64_t ui, int p) {
  ParamUnit& u = units[ui];
  if (!u.g) throw std::logic_error("gradient buffer of " + u.name + " used before acquire_grads");
  return u.g.data() + u.params[p].offset;
}

void ParamStore::tp_fixups(ParamUnit& u, float* g) {
  if (pc_.plan.tp == 1) return;
  for (auto& p : u.params) {
    if (p.grad_partial_over_tp) pc_.tp->allreduce_sum(g + p.offset, p.numel());
    if (p.split == TpSplit::kv_rows && l_.kv_replicas > 1) {
      // the TP ranks sharing a KV head each hold part of its gradient: sum them per head
      Tensor tmp = be_.alloc(p.full_rows, p.cols, Mem::comm_buffers);
      float* mine = tmp.data() + l_.kv_head0 * l_.head_dim * p.cols;
      be_.copy(mine, g + p.offset, p.numel());
      pc_.tp->allreduce_sum(tmp.data(), tmp.numel());
      be_.copy(g + p.offset, mine, p.numel());
    }
  }
}

void ParamStore::finish_grads(int64_t ui) {
  if (zero_ < 2) return;
  ParamUnit& u = units[ui];
  tp_fixups(u, u.g.data());
  Tensor part = be_.alloc(1, u.shard, Mem::comm_buffers);
  pc_.zero->reduce_scatter(u.g.data(), part.data(), u.shard);
  be_.axpy(u.g_shard.data(), 1.0f, part.data(), u.shard);
  u.g.reset();
}

void ParamStore::reduce_grads() {
  if (zero_ >= 2) return;
  for (auto& u : units) {
    tp_fixups(u, u.g.data());
    pc_.zero->allreduce_sum(u.g.data(), u.padded);
  }
}

void ParamStore::zero_grads() {
  for (auto& u : units) {
    if (u.g) be_.fill(u.g.data(), 0.0f, u.g.numel());
    if (u.g_shard) be_.fill(u.g_shard.data(), 0.0f, u.g_shard.numel());
  }
}

float* ParamStore::shard_grad(ParamUnit& u) { return zero_ >= 2 ? u.g_shard.data() : u.g.data() + u.shard_offset; }

double ParamStore::grad_norm() {
  double ss = 0;
  const bool dedupe_zero = shard_degree_ == 1 && pc_.zero->rank() != 0;  // unsharded: every zero rank holds the same
  if (!dedupe_zero) {
    for (auto& u : units) {
      const float* g = shard_grad(u);
      for (auto& p : u.params) {
        if (!p.counted_here) continue;
        int64_t a = std::max(p.offset, u.shard_offset), b = std::min(p.offset + p.numel(), u.shard_offset + u.shard);
        if (b > a) ss += be_.sum_squares(g + (a - u.shard_offset), b - a);
      }
    }
  }
  pc_.world_comm->allreduce_sum(&ss, 1);
  return std::sqrt(ss);
}

void ParamStore::optimizer_step(const OptimizerConfig& c, int64_t step, float grad_scale) {
  const float lr = learning_rate(c, step);
  for (auto& u : units) {
    const float* g = shard_grad(u);
    for (auto& p : u.params) {
      int64_t a = std::max(p.offset, u.shard_offset), b = std::min(p.offset + p.numel(), u.shard_offset + u.shard);
      if (b <= a) continue;
      int64_t o = a - u.shard_offset;
      be_.adamw(u.master.data() + o, u.m.data() + o, u.v.data() + o, g + o, p.decay ? 1.0f : 0.0f, b - a, lr, c.beta1,
                c.beta2, c.eps, c.weight_decay, grad_scale, step);
    }
    if (zero_ == 3) {
      be_.copy(u.w_shard.data(), u.master.data(), u.shard);
    } else if (shard_degree_ == 1) {
      be_.copy(u.w.data(), u.master.data(), u.shard);
    } else {
      Tensor send = be_.alloc(1, u.shard, Mem::comm_buffers);
      be_.copy(send.data(), u.master.data(), u.shard);
      pc_.zero->allgather(send.data(), u.w.data(), u.shard);
    }
  }
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ParamStore::full_shapes() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (auto& u : units)
    for (auto& p : u.params) {
      if (p.full_rows == 1) out.push_back({p.name, {p.full_cols}});
      else out.push_back({p.name, {p.full_rows, p.full_cols}});
    }
  return out;
}

std::map<std::string, std::vector<float>> ParamStore::gather_full(const std::string& kind) {
  std::map<std::string, std::vector<float>> out;
  const int64_t tp = pc_.plan.tp;
  for (auto& u : units) {
    std::vector<float> flat(static_cast<size_t>(u.padded));
    auto from_shards = [&](const Tensor& shard) {
      if (shard_degree_ == 1) be_.copy(flat.data(), shard.data(), u.padded);
      else pc_.zero->allgather(shard.data(), flat.data(), u.shard);
    };
    if (kind == "weights") {
      if (zero_ == 3) from_shards(u.w_shard);
      else be_.copy(flat.data(), u.w.data(), u.padded);
    } else if (kind == "grads") {
      if (zero_ >= 2) pc_.zero->allgather(u.g_shard.data(), flat.data(), u.shard);
      else be_.copy(flat.data(), u.g.data(), u.padded);
    } else if (kind == "master") from_shards(u.master);
    else if (kind == "m") from_shards(u.m);
    else if (kind == "v") from_shards(u.v);
    else throw std::logic_error("gather_full: unknown kind " + kind);
    for (auto& p : u.params) {
      std::vector<float> all(static_cast<size_t>(p.numel() * tp));
      pc_.tp->allgather(flat.data() + p.offset, all.data(), p.numel());
      std::vector<float> full(static_cast<size_t>(p.full_rows * p.full_cols));
      for (int64_t t = 0; t < tp; ++t) {
        const float* loc = all.data() + t * p.numel();
        int64_t kv0 = kv_head0_of(l_, t);
        for (int64_t r = 0; r < p.rows; ++r)
          for (int64_t c = 0; c < p.cols; ++c) {
            int64_t fr = r, fc = c;
            if (p.split == TpSplit::rows) fr = t * p.rows + r;
            if (p.split == TpSplit::cols) fc = t * p.cols + c;
            if (p.split == TpSplit::kv_rows) fr = kv0 * l_.head_dim + r;
            if (fr < p.full_rows) full[fr * p.full_cols + fc] = loc[r * p.cols + c];
          }
      }
      out[p.name] = std::move(full);
    }
  }
  return out;
}

void ParamStore::load_full(const std::string& kind, const std::map<std::string, std::vector<float>>& full,
                           const std::string& where) {
  const int64_t t = pc_.coord.tp;
  for (auto& u : units) {
    std::vector<float> flat(static_cast<size_t>(u.padded), 0.0f);
    for (auto& p : u.params) {
      auto it = full.find(p.name);
      if (it == full.end()) throw InputError(where, p.name, "tensor missing from the checkpoint");
      if (static_cast<int64_t>(it->second.size()) != p.full_rows * p.full_cols)
        throw InputError(where, p.name,
                         "has " + std::to_string(it->second.size()) + " elements, the model needs " +
                             std::to_string(p.full_rows) + " x " + std::to_string(p.full_cols));
      int64_t kv0 = kv_head0_of(l_, t);
      slice_local(p, it->second.data(), flat.data() + p.offset, t, kv0, l_.head_dim);
    }
    Tensor* dst = kind == "master" ? &u.master : kind == "m" ? &u.m : &u.v;
    be_.copy(dst->data(), flat.data() + u.shard_offset, u.shard);
    if (kind == "master") {
      if (zero_ == 3) be_.copy(u.w_shard.data(), flat.data() + u.shard_offset, u.shard);
      else be_.copy(u.w.data(), flat.data(), u.padded);
    }
  }
}

}  // namespace ctx::exec
