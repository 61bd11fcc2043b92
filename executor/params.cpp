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
  shard_degree_ = zero_ >= 1 ? pc.zero_shard->size() : 1;  // dp*cp, or HSDP's zero_shard
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
  const DType act = l.act;
  for (auto& u : units) {
    u.padded = (u.numel + shard_degree_ - 1) / shard_degree_ * shard_degree_;
    u.shard = u.padded / shard_degree_;
    u.shard_offset = shard_degree_ > 1 ? pc.zero_shard->rank() * u.shard : 0;
    std::vector<float> local(static_cast<size_t>(u.padded), 0.0f);
    for (auto& p : u.params) {
      auto full = init_full(p, m.layers, seed);
      slice_local(p, full.data(), local.data() + p.offset, t, kv_head0_of(l, t), d);
    }
    auto opt_tensor = [&](HostMem hc, Mem dc, DType dt) {
      return host_opt ? be_.alloc_host(1, u.shard, dt, hc) : be_.alloc(1, u.shard, dt, dc);
    };
    // optimizer precision (plan keys master, moments; ctxrun's own: fp32): master=none keeps no
    // copy (the update steps the compute weights), moments=bf16 stores m and v in bf16
    if (plan.master != StateDtype::none) {
      u.master = opt_tensor(HostMem::master_weights, Mem::master_weights, DType::f32);
      be_.upload(u.master, local.data() + u.shard_offset);
    }
    const DType moments = plan.moments == StateDtype::bf16 ? DType::bf16 : DType::f32;
    u.m = opt_tensor(HostMem::optimizer, Mem::optimizer, moments);
    u.v = opt_tensor(HostMem::optimizer, Mem::optimizer, moments);
    be_.zero(u.m);
    be_.zero(u.v);
    if (zero_ == 3) {
      u.w_shard = host_params ? be_.alloc_host(1, u.shard, act, HostMem::weights) : be_.alloc(1, u.shard, act, Mem::weights);
      be_.upload(u.w_shard, local.data() + u.shard_offset);
    } else {
      u.w = be_.alloc(1, u.padded, act, Mem::weights);
      be_.upload(u.w, local.data());
    }
    if (zero_ >= 2) {
      u.g_shard = be_.alloc(1, u.shard, DType::f32, Mem::grads);
      be_.zero(u.g_shard);
    } else {
      u.g = be_.alloc(1, u.padded, DType::f32, Mem::grads);
      be_.zero(u.g);
    }
  }
}

View ParamStore::weight(int64_t ui, int p) const {
  const ParamUnit& u = units[ui];
  if (!u.w) throw std::logic_error("weights of " + u.name + " used before acquire_weights");
  const ParamInfo& pi = u.params[p];
  return u.w.flat(pi.offset, pi.numel()).as(pi.rows, pi.cols);
}

View ParamStore::grad(int64_t ui, int p) const {
  const ParamUnit& u = units[ui];
  if (!u.g) throw std::logic_error("gradient buffer of " + u.name + " used before acquire_grads");
  const ParamInfo& pi = u.params[p];
  return u.g.flat(pi.offset, pi.numel()).as(pi.rows, pi.cols);
}

void ParamStore::acquire_weights(int64_t ui) {
  ParamUnit& u = units[ui];
  if (zero_ != 3 || u.w) return;
  if (pc_.zero_shard->size() > 1) {  // the simulator's names: the embedding, a layer, the final norm + head
    const bool layer = ui >= 1 && ui < final_unit();
    if (layer && pc_.plan.param_offload) pc_.trace.add_at("param_h2d", SimStream::host, ui - 1);
    pc_.trace.add_at(ui == 0 ? "zero3_gather_embedding" : layer ? "zero3_all_gather" : "zero3_gather_head", SimStream::dp,
                     layer ? ui - 1 : -1);
  }
  u.w = be_.alloc(1, u.padded, l_.act, Mem::comm_buffers);
  pc_.zero_shard->allgather(u.w_shard, u.w);
}

void ParamStore::release_weights(int64_t ui) {
  if (zero_ == 3) units[ui].w.reset();
}

void ParamStore::acquire_grads(int64_t ui) {
  ParamUnit& u = units[ui];
  if (zero_ >= 2 && !u.g) {
    u.g = be_.alloc(1, u.padded, DType::f32, Mem::comm_buffers);
    be_.zero(u.g);
  }
}

void ParamStore::tp_fixups(ParamUnit& u, const Tensor& g) {
  if (pc_.plan.tp == 1) return;
  const int64_t ui = &u - units.data();
  const int64_t layer = ui >= 1 && ui < final_unit() ? ui - 1 : -1;
  for (auto& p : u.params) {
    const View gp = g.flat(p.offset, p.numel());
    if (p.grad_partial_over_tp) {
      pc_.trace.add_at("tp_grad_fixup", SimStream::tp, layer);
      pc_.tp->allreduce_sum(gp);
    }
    if (p.split == TpSplit::kv_rows && l_.kv_replicas > 1) {
      pc_.trace.add_at("tp_grad_fixup", SimStream::tp, layer);
      // the TP ranks sharing a KV head each hold part of its gradient: sum them per head
      Tensor tmp = be_.alloc(p.full_rows, p.cols, DType::f32, Mem::comm_buffers);
      be_.zero(tmp);
      const View mine = tmp.flat(l_.kv_head0 * l_.head_dim * p.cols, p.numel());
      be_.copy(mine, gp);
      pc_.tp->allreduce_sum(tmp);
      be_.copy(gp, mine);
    }
  }
}

void ParamStore::finish_grads(int64_t ui, bool last) {
  if (zero_ < 2 && !last) return;  // ZeRO-0/1 accumulate until the step's last micro-batch
  ParamUnit& u = units[ui];
  tp_fixups(u, u.g);
  if (pc_.zero->size() > 1)
    pc_.trace.add_at(ui == 0 ? "embed_grad_reduce" : ui == final_unit() ? "head_grad_reduce" : "grad_reduce", SimStream::dp,
                     ui >= 1 && ui < final_unit() ? ui - 1 : -1);
  const bool replicated = pc_.zero_replicate->size() > 1;  // HSDP
  if (zero_ < 2 && !(zero_ == 1 && replicated)) {
    pc_.zero->allreduce_sum(u.g);
    return;
  }
  // ZeRO-2/3, and HSDP's ZeRO-1 (Megatron's optimizer instances): reduce-scatter inside the shard
  // group; under HSDP the shard's replicas hold the same shard of other ranks' gradients: sum them
  // (zero_comm.hpp). ZeRO-1 keeps the reduced shard in its full buffer.
  Tensor part = be_.alloc(1, u.shard, DType::f32, Mem::comm_buffers);
  pc_.zero_shard->reduce_scatter(u.g, part);
  if (replicated) pc_.zero_replicate->allreduce_sum(part);
  if (zero_ == 1) {
    be_.copy(u.g.flat(u.shard_offset, u.shard), part);
    return;
  }
  be_.axpy(u.g_shard, 1.0f, part);
  u.g.reset();
}

void ParamStore::zero_grads() {
  for (auto& u : units) {
    if (u.g) be_.zero(u.g);
    if (u.g_shard) be_.zero(u.g_shard);
  }
}

View ParamStore::shard_grad(ParamUnit& u) { return zero_ >= 2 ? u.g_shard.view() : u.g.flat(u.shard_offset, u.shard); }

void ParamStore::grad_norm2(View stats) {
  // unsharded: every zero rank holds the same gradients; HSDP: every replica of a shard holds the same shard
  const bool dedupe_zero = shard_degree_ == 1 ? pc_.zero->rank() != 0 : pc_.zero_replicate->rank() != 0;
  if (!dedupe_zero) {
    for (auto& u : units) {
      const View g = shard_grad(u);
      for (auto& p : u.params) {
        if (!p.counted_here) continue;
        int64_t a = std::max(p.offset, u.shard_offset), b = std::min(p.offset + p.numel(), u.shard_offset + u.shard);
        if (b > a) be_.sum_squares(stats, g.flat(a - u.shard_offset, b - a));
      }
    }
  }
  pc_.world_comm->allreduce_sum(stats.flat(kStatGradNorm2, 1));
}

void ParamStore::optimizer_step(const OptimizerConfig& c, int64_t step, View stats) {
  AdamWArgs a;
  a.lr = learning_rate(c, step);
  a.beta1 = c.beta1;
  a.beta2 = c.beta2;
  a.eps = c.eps;
  a.weight_decay = c.weight_decay;
  a.clip = c.clip;
  a.step = step;
  pc_.trace.layer = -1;
  if (pc_.plan.opt_offload) {  // the host optimizer: gradients down, AdamW on the host shard, weights up
    pc_.trace.add("grads_d2h", SimStream::host);
    pc_.trace.add("cpu_adamw", SimStream::host);
    pc_.trace.add("params_h2d", SimStream::host);
  } else {
    pc_.trace.add("adamw", SimStream::compute);
  }
  for (auto& u : units) {
    const View g = shard_grad(u);
    for (auto& p : u.params) {
      int64_t lo = std::max(p.offset, u.shard_offset), hi = std::min(p.offset + p.numel(), u.shard_offset + u.shard);
      if (hi <= lo) continue;
      const int64_t o = lo - u.shard_offset, n = hi - lo;
      a.decay = p.decay ? 1.0f : 0.0f;
      be_.adamw(master_shard(u).flat(o, n), u.m.flat(o, n), u.v.flat(o, n), g.flat(o, n), stats, a);
    }
  }
  refresh_weights();
}

View ParamStore::master_shard(ParamUnit& u) {
  if (u.master) return u.master.view();
  // master=none: this rank's shard of the compute weights (ZeRO-3's own shard; else its slice of the full copy)
  return zero_ == 3 ? u.w_shard.view() : u.w.flat(u.shard_offset, u.shard);
}

Tensor ParamStore::upload_flat(const float* src, int64_t n, DType dt, Mem cat) {
  Tensor t = be_.alloc(1, n, dt, cat);
  be_.upload(t, src);
  return t;
}

std::vector<float> ParamStore::download(View v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  be_.download(out.data(), v);
  return out;
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
    // this TP rank's flat unit: whole, or all-gathered from the ZeRO shards
    auto from_shards = [&](View shard) {
      if (shard_degree_ == 1) return download(shard.flat(0, u.padded));
      Tensor all = be_.alloc(1, u.padded, shard.dtype(), Mem::comm_buffers);
      pc_.zero_shard->allgather(shard, all);
      return download(all);
    };
    // HSDP's ZeRO-1 holds the reduced gradient in its own shard of the full buffer only
    const bool grads_sharded = zero_ >= 2 || (zero_ == 1 && pc_.zero_replicate->size() > 1);
    std::vector<float> flat;
    if (kind == "weights") flat = zero_ == 3 ? from_shards(u.w_shard) : download(u.w);
    else if (kind == "grads") flat = !grads_sharded ? download(u.g) : from_shards(zero_ >= 2 ? u.g_shard.view() : u.g.flat(u.shard_offset, u.shard));
    else if (kind == "master" && !u.master) flat = zero_ == 3 ? from_shards(u.w_shard) : download(u.w);  // master=none
    else if (kind == "master") flat = from_shards(u.master);
    else if (kind == "m") flat = from_shards(u.m);
    else if (kind == "v") flat = from_shards(u.v);
    else throw std::logic_error("gather_full: unknown kind " + kind);
    for (auto& p : u.params) {
      Tensor mine = upload_flat(flat.data() + p.offset, p.numel(), DType::f32, Mem::comm_buffers);
      Tensor gathered = be_.alloc(1, p.numel() * tp, DType::f32, Mem::comm_buffers);
      pc_.tp->allgather(mine, gathered);
      std::vector<float> all = download(gathered);
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
    if (*dst) be_.upload(*dst, flat.data() + u.shard_offset);  // master=none: only the compute weights below
    if (kind == "master") {
      if (zero_ == 3) be_.upload(u.w_shard, flat.data() + u.shard_offset);
      else be_.upload(u.w, flat.data());
    }
  }
}

std::vector<float> ParamStore::download_shard(int64_t ui, const std::string& kind) {
  ParamUnit& u = units.at(static_cast<size_t>(ui));
  if (kind == "master") return download(master_shard(u));
  const Tensor* src = kind == "m" ? &u.m : kind == "v" ? &u.v : nullptr;
  if (!src) throw std::logic_error("download_shard: unknown kind " + kind);
  return download(src->flat(0, u.shard));
}

void ParamStore::upload_shard(int64_t ui, const std::string& kind, const std::vector<float>& data) {
  ParamUnit& u = units.at(static_cast<size_t>(ui));
  Tensor* dst = kind == "master" ? &u.master : kind == "m" ? &u.m : kind == "v" ? &u.v : nullptr;
  if (!dst) throw std::logic_error("upload_shard: unknown kind " + kind);
  if (static_cast<int64_t>(data.size()) != u.shard)
    throw std::logic_error("upload_shard: " + u.name + " needs " + std::to_string(u.shard) + " floats, got " +
                           std::to_string(data.size()));
  be_.upload(kind == "master" ? master_shard(u) : dst->flat(0, u.shard), data.data());
}

void ParamStore::refresh_weights() {
  if (zero_ < 3 && shard_degree_ > 1) pc_.trace.add("param_all_gather", SimStream::dp);
  for (auto& u : units) {
    if (zero_ == 3) {
      if (u.master) be_.copy(u.w_shard, u.master);  // master=none: the update wrote the shard itself
    } else if (shard_degree_ == 1) {
      if (u.master) be_.copy(u.w.flat(0, u.shard), u.master);
    } else {
      Tensor send = be_.alloc(1, u.shard, l_.act, Mem::comm_buffers);
      be_.copy(send, master_shard(u));
      pc_.zero_shard->allgather(send, u.w);
    }
  }
}

}  // namespace ctx::exec
