// The event-queue simulator as it was before the streaming sweep (issue 15): every task stored with
// its own dependency list and run through a priority queue. Kept unchanged as the oracle that
// tests/test_simulator_oracle.cpp compares simulate_step against, and as the baseline of
// bench/bench_simulator.cpp. Not used by the planner.
#include "costmodel/simulator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>

#include "costmodel/process_groups.hpp"

namespace ctx {

namespace {

bool same_vector(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > 1e-9 * std::max(1e-12, std::abs(a[i]))) return false;
  return true;
}

// Builds the task graph: the same program for every simulated rank, generated in lockstep so
// that collectives get one id across their members.
class Builder {
 public:
  Builder(const StepCosts& k, const Plan& p, SimResult& out) : k_(k), p_(p), out_(out) {}

  void build() {
    choose_reps();
    const int R = static_cast<int>(out_.reps.size());
    last_.assign(static_cast<size_t>(R) * kSimStreams, -1);
    for (int64_t mb = 0; mb < k_.ga; ++mb) {
      mb_ = static_cast<int32_t>(mb);
      const bool reduce = k_.grad_reduce_every_microbatch || mb + 1 == k_.ga;
      forward();
      loss(reduce);
      backward(reduce);
    }
    optimizer();
  }

 private:
  // ---- reps -------------------------------------------------------------------------------
  void choose_reps() {
    const size_t classes = k_.attn_fwd.size();
    const int64_t cp = k_.cp;
    bool symmetric = true;
    for (size_t c = 0; c < classes && symmetric; ++c)
      for (int64_t r = 1; r < cp && symmetric; ++r)
        symmetric = same_vector(k_.attn_fwd[c][static_cast<size_t>(r)], k_.attn_fwd[c][0]) &&
                    same_vector(k_.attn_bwd[c][static_cast<size_t>(r)], k_.attn_bwd[c][0]);
    cp_reps_ = symmetric ? 1 : cp;
    const int64_t dp = std::max<int64_t>(1, p_.dp);
    for (size_t c = 0; c < classes; ++c) {
      for (int64_t i = 0; i < cp_reps_; ++i) {
        SimRep r;
        RankCoord rc;
        rc.cp = i;
        rc.ulysses = i % k_.ulysses;
        rc.ring = i / k_.ulysses;
        rc.dp = k_.pack_dp_rank.empty() ? 0 : k_.pack_dp_rank[c];
        r.rank = rank_of_coord(p_, rc);
        r.cp_index = i;
        r.pack_class = static_cast<int>(c);
        r.stands_for = (symmetric ? cp : 1) * k_.tp * (classes == 1 ? dp : 1);
        r.label = "rank " + std::to_string(r.rank) + " (cp " + std::to_string(i) + (symmetric && cp > 1 ? ", all cp ranks alike" : "") +
                  (classes > 1 ? (c == 0 ? ", heaviest pack" : ", lightest pack") : "") + ")";
        out_.reps.push_back(r);
      }
    }
  }
  int rep_index(int cls, int64_t cp_index) const { return cls * static_cast<int>(cp_reps_) + static_cast<int>(cp_index % cp_reps_); }
  int nreps() const { return static_cast<int>(out_.reps.size()); }

  // ---- task creation ------------------------------------------------------------------------
  int32_t add(int rep, SimStream s, const char* name, double dur, SimPass pass, SimCategory cat, int32_t layer,
              std::initializer_list<int32_t> deps, int32_t coll = -1) {
    SimTask t;
    t.name = name;
    t.duration = std::max(0.0, dur);
    t.rep = rep;
    t.layer = layer;
    t.micro_batch = mb_;
    t.collective = coll;
    t.stream = s;
    t.pass = pass;
    t.category = cat;
    int32_t id = static_cast<int32_t>(out_.tasks.size());
    out_.tasks.push_back(t);
    std::vector<int32_t> d;
    int32_t& prev = last_[static_cast<size_t>(rep) * kSimStreams + static_cast<int>(s)];
    if (prev >= 0) d.push_back(prev);  // in-order stream
    for (int32_t x : deps)
      if (x >= 0) d.push_back(x);
    prev = id;
    out_.deps.push_back(std::move(d));
    return id;
  }
  int32_t new_collective() { return next_coll_++; }

  // A collective over a group: members are the simulated reps with the same group key.
  enum class G { self, ulysses, cp, zero };
  std::vector<int32_t> collective(G g, SimStream s, const char* name, double dur, SimPass pass, int32_t layer,
                                  const std::vector<int32_t>& dep_per_rep) {
    std::vector<int32_t> ids(static_cast<size_t>(nreps()), -1);
    if (dur <= 0) return dep_per_rep;  // nothing to wait for: later tasks depend on what this would have
    std::vector<int32_t> coll_of_key(static_cast<size_t>(nreps()) + 1, -1);
    for (int r = 0; r < nreps(); ++r) {
      int key = 0;
      const SimRep& rep = out_.reps[static_cast<size_t>(r)];
      switch (g) {
        case G::self: key = r; break;
        case G::ulysses: key = rep.pack_class * static_cast<int>(k_.cp) + static_cast<int>(rep.cp_index / k_.ulysses); break;
        case G::cp: key = rep.pack_class; break;
        case G::zero: key = 0; break;
      }
      key = std::min(key, nreps());
      int32_t c = -1;
      if (g != G::self) {
        if (coll_of_key[static_cast<size_t>(key)] < 0) coll_of_key[static_cast<size_t>(key)] = new_collective();
        c = coll_of_key[static_cast<size_t>(key)];
      }
      ids[static_cast<size_t>(r)] = add(r, s, name, dur, pass, SimCategory::comm, layer, {dep_per_rep[static_cast<size_t>(r)]}, c);
    }
    return ids;
  }
  std::vector<int32_t> compute(const char* name, double dur, SimPass pass, int32_t layer, const std::vector<int32_t>& dep_a,
                               const std::vector<int32_t>* dep_b = nullptr, SimCategory cat = SimCategory::compute) {
    std::vector<int32_t> ids(static_cast<size_t>(nreps()));
    for (int r = 0; r < nreps(); ++r)
      ids[static_cast<size_t>(r)] = add(r, SimStream::compute, name, dur, pass, cat, layer,
                                        {dep_a[static_cast<size_t>(r)], dep_b ? (*dep_b)[static_cast<size_t>(r)] : -1});
    return ids;
  }
  std::vector<int32_t> host(const char* name, double dur, SimPass pass, int32_t layer, const std::vector<int32_t>& dep,
                            SimCategory cat = SimCategory::host) {
    std::vector<int32_t> ids(static_cast<size_t>(nreps()), -1);
    if (dur <= 0) return dep;
    for (int r = 0; r < nreps(); ++r)
      ids[static_cast<size_t>(r)] = add(r, SimStream::host, name, dur, pass, cat, layer, {dep[static_cast<size_t>(r)]});
    return ids;
  }
  std::vector<int32_t> none() const { return std::vector<int32_t>(static_cast<size_t>(nreps()), -1); }

  // the partial sums of a row-parallel output over TP: reduce-scatter under SP, else all-reduce
  std::vector<int32_t> tp_reduce(SimPass pass, int32_t layer, const std::vector<int32_t>& after) {
    // (layer < 0: around the layers, the *_ends values, which tp_overlap leaves on the TP stream)
    return k_.sp ? collective(G::self, SimStream::tp, "tp_reduce_scatter", layer < 0 ? k_.tp_rs_ends : k_.tp_rs, pass, layer, after)
                 : collective(G::self, SimStream::tp, "tp_all_reduce", layer < 0 ? k_.tp_ar_ends : k_.tp_ar, pass, layer, after);
  }
  std::vector<int32_t> tp_gather(SimPass pass, int32_t layer, const std::vector<int32_t>& after) {
    return k_.sp ? collective(G::self, SimStream::tp, "tp_all_gather", layer < 0 ? k_.tp_ag_ends : k_.tp_ag, pass, layer, after) : after;
  }
  // gradients TP ranks hold partial sums of, summed before the unit's reduction
  std::vector<int32_t> tp_fixups(int32_t layer, int norms, int kvs, const std::vector<int32_t>& after) {
    auto d = after;
    for (int i = 0; i < norms; ++i)
      d = collective(G::self, SimStream::tp, "tp_grad_fixup", k_.tp_fixup_norm, SimPass::backward, layer, d);
    for (int i = 0; i < kvs; ++i)
      d = collective(G::self, SimStream::tp, "tp_grad_fixup", k_.tp_fixup_kv, SimPass::backward, layer, d);
    return d;
  }

  // ---- attention core ---------------------------------------------------------------------------
  std::vector<int32_t> attention(SimPass pass, int32_t layer, const std::vector<int32_t>& after, bool backward) {
    const auto& costs = backward ? k_.attn_bwd : k_.attn_fwd;
    const char* name = backward ? "attention_bwd" : pass == SimPass::recompute ? "attention_recompute" : "attention";
    const bool ring_kind = (k_.cp_kind == CpKind::ring || k_.cp_kind == CpKind::zigzag || k_.cp_kind == CpKind::usp) && k_.ring > 1;
    auto cost = [&](int r, size_t step) {
      const SimRep& rep = out_.reps[static_cast<size_t>(r)];
      const auto& v = costs[static_cast<size_t>(rep.pack_class)][static_cast<size_t>(rep.cp_index)];
      return step < v.size() ? v[step] : 0.0;
    };
    if (!ring_kind) {
      std::vector<int32_t> dep = after;
      if (k_.cp_kind == CpKind::allgather && k_.kv_ag > 0)
        dep = collective(G::cp, SimStream::tp, "kv_all_gather", k_.kv_ag, pass, layer, after);
      std::vector<int32_t> ids(static_cast<size_t>(nreps()));
      for (int r = 0; r < nreps(); ++r)
        ids[static_cast<size_t>(r)] = add(r, SimStream::compute, name, cost(r, 0), pass, SimCategory::compute, layer, {dep[static_cast<size_t>(r)]});
      if (backward && k_.cp_kind == CpKind::allgather && k_.dkv_rs > 0)
        ids = collective(G::cp, SimStream::tp, "dkv_reduce_scatter", k_.dkv_rs, pass, layer, ids);
      return ids;
    }
    // K,V of the next step travel while this step computes. In the backward each block's dK,dV
    // travel with it too: rank r receives a block's partial sum from its neighbour once that
    // neighbour has computed its step and summed what it had received itself; r adds it after its
    // own compute of the block (the hop overlaps that compute), and after the last step each
    // block's total hops home to its owner.
    std::vector<int32_t> have = after;  // when each rank holds the block it will send next
    std::vector<int32_t> have_dkv = none();
    std::vector<int32_t> last_compute(static_cast<size_t>(nreps()), -1);
    auto prev_of = [&](int r) {
      const SimRep& rep = out_.reps[static_cast<size_t>(r)];
      return rep_index(rep.pack_class, (rep.cp_index - k_.ulysses + k_.cp) % k_.cp);  // ring neighbour that sends to r
    };
    const int64_t steps = k_.ring;
    for (int64_t j = 0; j < steps; ++j) {
      std::vector<int32_t> recv(static_cast<size_t>(nreps()), -1);
      if (j + 1 < steps) {
        for (int r = 0; r < nreps(); ++r)
          recv[static_cast<size_t>(r)] = add(r, SimStream::ring, "ring_kv", k_.p2p_fwd, pass, SimCategory::comm, layer,
                                             {have[static_cast<size_t>(r)], have[static_cast<size_t>(prev_of(r))]});
      }
      for (int r = 0; r < nreps(); ++r)
        last_compute[static_cast<size_t>(r)] = add(r, SimStream::compute, name, cost(r, static_cast<size_t>(j)), pass, SimCategory::compute,
                                                   layer, {have[static_cast<size_t>(r)]});
      if (backward) {
        std::vector<int32_t> dkv(static_cast<size_t>(nreps()), -1);
        for (int r = 0; r < nreps(); ++r) {
          const int prev = prev_of(r);
          dkv[static_cast<size_t>(r)] = add(r, SimStream::ring, "ring_dkv", k_.p2p_dkv, pass, SimCategory::comm, layer,
                                            {last_compute[static_cast<size_t>(prev)], have_dkv[static_cast<size_t>(prev)]});
        }
        have_dkv = dkv;
      }
      if (j + 1 < steps) have = recv;
    }
    if (!backward) return last_compute;
    // dq is done with the last compute, dK,dV with the hop home
    for (int r = 0; r < nreps(); ++r)
      last_compute[static_cast<size_t>(r)] =
          add(r, SimStream::compute, "ring_dkv_sum", 0.0, pass, SimCategory::compute, layer,
              {last_compute[static_cast<size_t>(r)], have_dkv[static_cast<size_t>(r)]});
    return last_compute;
  }

  // ---- one layer forward (also the recompute pass) ----------------------------------------------
  std::vector<int32_t> layer_forward(int32_t l, SimPass pass, const std::vector<int32_t>& after, const std::vector<int32_t>& params) {
    auto d = after;
    if (k_.sp) d = collective(G::self, SimStream::tp, "tp_all_gather", k_.tp_ag, pass, l, d);
    d = compute("norm_qkv_rope", k_.pre_fwd, pass, l, d, &params);
    if (k_.ulysses > 1) d = collective(G::ulysses, SimStream::tp, "ulysses_a2a_qkv", k_.a2a_qkv, pass, l, d);
    d = attention(pass, l, d, false);
    if (k_.ulysses > 1) d = collective(G::ulysses, SimStream::tp, "ulysses_a2a_out", k_.a2a_out, pass, l, d);
    d = compute("o_proj_residual_norm", k_.post_fwd, pass, l, d);
    d = k_.sp ? collective(G::self, SimStream::tp, "tp_reduce_scatter", k_.tp_rs, pass, l, d)
              : collective(G::self, SimStream::tp, "tp_all_reduce", k_.tp_ar, pass, l, d);
    if (k_.sp) d = collective(G::self, SimStream::tp, "tp_all_gather", k_.tp_ag, pass, l, d);
    d = compute("mlp", k_.mlp_fwd, pass, l, d);
    d = k_.sp ? collective(G::self, SimStream::tp, "tp_reduce_scatter", k_.tp_rs, pass, l, d)
              : collective(G::self, SimStream::tp, "tp_all_reduce", k_.tp_ar, pass, l, d);
    return d;
  }

  void forward() {
    const int32_t L = static_cast<int32_t>(k_.layers);
    fwd_end_.assign(static_cast<size_t>(L), none());
    std::vector<std::vector<int32_t>> gathered(static_cast<size_t>(L), none());
    auto gather = [&](int32_t l, SimPass pass, const std::vector<int32_t>& buffer_free) {
      auto h = host("param_h2d", k_.param_h2d, pass, l, buffer_free);
      return collective(G::zero, SimStream::dp, "zero3_all_gather", k_.zero3_ag, pass, l, h);
    };
    std::vector<int32_t> d = mb_end_;
    if (d.empty()) d = none();
    // the embedding lookup (its gather under ZeRO-3 first); the lookup copies [T, h] rows and is
    // not priced (memory-bound, far below a layer)
    const auto embed = collective(G::zero, SimStream::dp, "zero3_gather_embedding", k_.zero3_embed_ag, SimPass::forward, -1, d);
    d = compute("embedding", 0.0, SimPass::forward, -1, d, &embed);
    d = tp_reduce(SimPass::forward, -1, d);  // the vocab-parallel embedding's partial rows
    gathered[0] = gather(0, SimPass::forward, d);
    for (int32_t l = 0; l < L; ++l) {
      // prefetch the next layer's parameters while this one runs (two layers' buffers)
      if (l + 1 < L) gathered[static_cast<size_t>(l + 1)] = gather(l + 1, SimPass::forward, l >= 1 ? fwd_end_[static_cast<size_t>(l - 1)] : d);
      std::vector<int32_t> start = d;
      d = layer_forward(l, SimPass::forward, d, gathered[static_cast<size_t>(l)]);
      fwd_end_[static_cast<size_t>(l)] = d;
      if (k_.ckpt_d2h > 0) host("ckpt_d2h", k_.ckpt_d2h, SimPass::forward, l, start);
    }
    fwd_tail_ = d;
  }

  void loss(bool reduce) {
    // ZeRO-3 gathers the final norm (and untied head); a tied head is the embedding, gathered again
    auto params = collective(G::zero, SimStream::dp, "zero3_gather_head", k_.zero3_head_ag, SimPass::forward, -1, fwd_tail_);
    if (k_.tied_embeddings)
      params = collective(G::zero, SimStream::dp, "zero3_gather_embedding", k_.zero3_embed_ag, SimPass::forward, -1, params);
    auto x = tp_gather(SimPass::forward, -1, fwd_tail_);  // the final norm's output
    auto d = compute("head_loss", k_.head_fwd, SimPass::forward, -1, x, &params);
    // per logits tile, the vocab-parallel statistics (row max, then sum of exp and target logit);
    // the first tile's gradient follows its statistics, the other tiles' after theirs
    auto stats = [&](SimPass pass, const std::vector<int32_t>& after) {
      auto y = collective(G::self, SimStream::tp, "loss_tp_all_reduce", k_.loss_max_ar, pass, -1, after);
      return collective(G::self, SimStream::tp, "loss_tp_all_reduce", k_.loss_sum_ar, pass, -1, y);
    };
    d = stats(SimPass::forward, d);
    d = compute("head_loss_bwd", k_.head_bwd, SimPass::backward, -1, d);
    for (int64_t t = 1; t < k_.loss_tiles; ++t) d = stats(SimPass::backward, d);
    loss_end_ = tp_reduce(SimPass::backward, -1, d);  // d(final norm output) over TP
    if (reduce) {
      auto f = tp_fixups(-1, k_.tp_fixups_norm_final, 0, loss_end_);
      collective(G::zero, SimStream::dp, "head_grad_reduce", k_.head_grad_reduce, SimPass::backward, -1, f);
    }
  }

  void backward(bool reduce) {
    const int32_t L = static_cast<int32_t>(k_.layers);
    std::vector<int32_t> d = loss_end_;
    std::vector<std::vector<int32_t>> gathered(static_cast<size_t>(L), none()), bwd_end(static_cast<size_t>(L), none());
    std::vector<std::vector<int32_t>> ckpt_in(static_cast<size_t>(L), none());
    auto gather = [&](int32_t l, const std::vector<int32_t>& buffer_free) {
      auto h = host("param_h2d", k_.param_h2d, SimPass::backward, l, buffer_free);
      return collective(G::zero, SimStream::dp, "zero3_all_gather", k_.zero3_ag, SimPass::backward, l, h);
    };
    auto fetch_ckpt = [&](int32_t l, const std::vector<int32_t>& buffer_free) {
      return host("ckpt_h2d", k_.ckpt_h2d, SimPass::backward, l, buffer_free);
    };
    gathered[static_cast<size_t>(L - 1)] = gather(L - 1, d);
    if (k_.ckpt_h2d > 0) ckpt_in[static_cast<size_t>(L - 1)] = fetch_ckpt(L - 1, d);
    std::vector<int32_t> last_reduce = none();
    for (int32_t l = L - 1; l >= 0; --l) {
      if (l >= 1) {
        const auto& free_buf = l + 1 < L ? bwd_end[static_cast<size_t>(l + 1)] : d;
        gathered[static_cast<size_t>(l - 1)] = gather(l - 1, free_buf);
        if (k_.ckpt_h2d > 0) ckpt_in[static_cast<size_t>(l - 1)] = fetch_ckpt(l - 1, free_buf);
      }
      const auto& params = gathered[static_cast<size_t>(l)];
      std::vector<int32_t> x = d;
      if (k_.ckpt_h2d > 0)  // the layer's checkpoint must be back on the device (a join, no work)
        x = compute("checkpoint_ready", 0.0, SimPass::backward, l, x, &ckpt_in[static_cast<size_t>(l)]);
      if (k_.recompute == Recompute::full) x = layer_forward(l, SimPass::recompute, x, params);
      // backward of the MLP half: d(out) gathered, and the recomputed norm output again (under SP
      // the weight gradient needs the whole sequence's input)
      x = tp_gather(SimPass::backward, l, x);
      x = tp_gather(SimPass::backward, l, x);
      x = compute("mlp_bwd", k_.mlp_bwd, SimPass::backward, l, x, &params);
      x = k_.sp ? collective(G::self, SimStream::tp, "tp_reduce_scatter", k_.tp_rs, SimPass::backward, l, x)
                : collective(G::self, SimStream::tp, "tp_all_reduce", k_.tp_ar, SimPass::backward, l, x);
      // backward of the attention half
      if (k_.sp) x = collective(G::self, SimStream::tp, "tp_all_gather", k_.tp_ag, SimPass::backward, l, x);
      // selective recompute rematerialises the attention core where its backward needs it, after
      // the MLP's backward (as Megatron's and ctxrun's do)
      // (under Ulysses from the saved sequence layout: q, k, v to the head layout and o back)
      if (k_.recompute == Recompute::selective) {
        if (k_.ulysses > 1) x = collective(G::ulysses, SimStream::tp, "ulysses_a2a_qkv", k_.a2a_qkv, SimPass::recompute, l, x);
        x = attention(SimPass::recompute, l, x, false);
        if (k_.ulysses > 1) x = collective(G::ulysses, SimStream::tp, "ulysses_a2a_out", k_.a2a_out, SimPass::recompute, l, x);
      }
      x = compute("o_proj_residual_norm_bwd", k_.post_bwd, SimPass::backward, l, x);
      // Ulysses: q, k, v, o (saved in the sequence layout) and d(out) to the head layout
      if (k_.ulysses > 1) x = collective(G::ulysses, SimStream::tp, "ulysses_a2a_out", k_.a2a_bwd_in, SimPass::backward, l, x);
      x = attention(SimPass::backward, l, x, true);
      if (k_.ulysses > 1) x = collective(G::ulysses, SimStream::tp, "ulysses_a2a_qkv", k_.a2a_qkv, SimPass::backward, l, x);
      x = tp_gather(SimPass::backward, l, x);  // the recomputed norm output, for the QKV weight gradients
      x = compute("norm_qkv_rope_bwd", k_.pre_bwd, SimPass::backward, l, x);
      x = k_.sp ? collective(G::self, SimStream::tp, "tp_reduce_scatter", k_.tp_rs, SimPass::backward, l, x)
                : collective(G::self, SimStream::tp, "tp_all_reduce", k_.tp_ar, SimPass::backward, l, x);
      bwd_end[static_cast<size_t>(l)] = x;
      if (reduce) {
        auto f = tp_fixups(l, k_.tp_fixups_norm_per_layer, k_.tp_fixups_kv_per_layer, x);
        last_reduce = collective(G::zero, SimStream::dp, "grad_reduce", k_.grad_reduce, SimPass::backward, l, f);
      }
      d = x;
    }
    d = tp_gather(SimPass::backward, -1, d);  // d(embedding output), whole sequence
    d = compute("embedding_bwd", 0.0, SimPass::backward, -1, d);  // scatter-add into the table, not priced (as its forward)
    if (reduce) last_reduce = collective(G::zero, SimStream::dp, "embed_grad_reduce", k_.embed_grad_reduce, SimPass::backward, -1, d);
    // the next micro-batch starts when this one's compute is done; reductions drain behind it
    mb_end_ = d;
    if (reduce) reduce_end_ = last_reduce;
  }

  void optimizer() {
    mb_ = static_cast<int32_t>(k_.ga - 1);
    std::vector<int32_t> d = reduce_end_.empty() ? mb_end_ : reduce_end_;
    for (int r = 0; r < nreps(); ++r)  // the optimizer needs the compute and the reductions done
      if (d[static_cast<size_t>(r)] < 0) d[static_cast<size_t>(r)] = mb_end_[static_cast<size_t>(r)];
    std::vector<int32_t> after_compute = mb_end_;
    if (k_.opt_host > 0) {
      std::vector<int32_t> x(static_cast<size_t>(nreps()));
      for (int r = 0; r < nreps(); ++r) x[static_cast<size_t>(r)] = std::max(d[static_cast<size_t>(r)], after_compute[static_cast<size_t>(r)]);
      x = host("grads_d2h", k_.opt_d2h, SimPass::optimizer, -1, x, SimCategory::optimizer);
      x = host("cpu_adamw", k_.opt_host, SimPass::optimizer, -1, x, SimCategory::optimizer);
      x = host("params_h2d", k_.opt_h2d, SimPass::optimizer, -1, x, SimCategory::optimizer);
      d = x;
    } else {
      d = compute("adamw", k_.opt_device, SimPass::optimizer, -1, after_compute, &d, SimCategory::optimizer);
    }
    collective(G::zero, SimStream::dp, "param_all_gather", k_.opt_param_ag, SimPass::optimizer, -1, d);
  }

  const StepCosts& k_;
  const Plan& p_;
  SimResult& out_;
  int64_t cp_reps_ = 1;
  int32_t mb_ = 0;
  int32_t next_coll_ = 0;
  std::vector<int32_t> last_;  // last task per (rep, stream)
  std::vector<std::vector<int32_t>> fwd_end_;
  std::vector<int32_t> fwd_tail_, loss_end_, mb_end_, reduce_end_;

 public:
  int32_t collectives() const { return next_coll_; }
};

struct Event {
  double time;
  int32_t task;
  bool operator>(const Event& o) const { return time > o.time || (time == o.time && task > o.task); }
};

void run_events(SimResult& r, int32_t ncoll) {
  auto& tasks = r.tasks;
  const size_t n = tasks.size();
  std::vector<int32_t> remaining(n), out_begin(n + 1, 0), out_list;
  for (size_t i = 0; i < n; ++i) {
    remaining[i] = static_cast<int32_t>(r.deps[i].size());
    for (int32_t d : r.deps[i]) ++out_begin[static_cast<size_t>(d) + 1];
  }
  for (size_t i = 0; i < n; ++i) out_begin[i + 1] += out_begin[i];
  out_list.resize(static_cast<size_t>(out_begin[n]));
  {
    std::vector<int32_t> fill(out_begin.begin(), out_begin.end() - 1);
    for (size_t i = 0; i < n; ++i)
      for (int32_t d : r.deps[i]) out_list[static_cast<size_t>(fill[static_cast<size_t>(d)]++)] = static_cast<int32_t>(i);
  }
  std::vector<int32_t> members(static_cast<size_t>(ncoll), 0), arrived(static_cast<size_t>(ncoll), 0);
  std::vector<double> arrival(static_cast<size_t>(ncoll), 0.0);
  std::vector<std::vector<int32_t>> waiting(static_cast<size_t>(ncoll));
  for (auto& t : tasks)
    if (t.collective >= 0) ++members[static_cast<size_t>(t.collective)];
  std::vector<double> full_ready(n, 0.0);
  std::priority_queue<Event, std::vector<Event>, std::greater<>> q;
  auto start = [&](int32_t i, double at) {
    SimTask& t = tasks[static_cast<size_t>(i)];
    if (t.start >= 0) ++r.stats.started_twice;
    t.start = at;
    q.push({at + t.duration, i});
  };
  auto became_ready = [&](int32_t i) {
    SimTask& t = tasks[static_cast<size_t>(i)];
    if (t.collective < 0) return start(i, full_ready[static_cast<size_t>(i)]);
    size_t c = static_cast<size_t>(t.collective);
    arrival[c] = std::max(arrival[c], full_ready[static_cast<size_t>(i)]);
    waiting[c].push_back(i);
    if (++arrived[c] == members[c])
      for (int32_t m : waiting[c]) start(m, arrival[c]);
  };
  for (size_t i = 0; i < n; ++i)
    if (remaining[i] == 0) became_ready(static_cast<int32_t>(i));
  double now = 0;
  while (!q.empty()) {
    Event e = q.top();
    q.pop();
    if (e.time < now) ++r.stats.time_regressions;
    now = e.time;
    ++r.stats.events;
    SimTask& t = tasks[static_cast<size_t>(e.task)];
    t.end = e.time;
    for (int32_t k = out_begin[static_cast<size_t>(e.task)]; k < out_begin[static_cast<size_t>(e.task) + 1]; ++k) {
      int32_t j = out_list[static_cast<size_t>(k)];
      SimTask& u = tasks[static_cast<size_t>(j)];
      full_ready[static_cast<size_t>(j)] = std::max(full_ready[static_cast<size_t>(j)], t.end);
      if (u.rep == t.rep) u.ready = std::max(u.ready, t.end);
      if (--remaining[static_cast<size_t>(j)] == 0) became_ready(j);
    }
  }
  for (auto& t : tasks)
    if (t.end < 0) ++r.stats.never_ran;
  r.stats.tasks = static_cast<int64_t>(n);
}

// Where the time of rep `rep` went: walk its compute stream, attribute each idle gap to what it
// waited for (the dependency that finished last).
StepBreakdown breakdown_of(const SimResult& r, int rep, double step) {
  StepBreakdown b;
  double prev_end = 0;
  auto attribute = [&](double gap, int32_t binding) {
    if (gap <= 0) return;
    if (binding < 0) { b.imbalance += gap; return; }
    const SimTask& w = r.tasks[static_cast<size_t>(binding)];
    double others = w.rep != rep ? gap : std::min(gap, std::max(0.0, w.start - w.ready));  // waited for other ranks
    b.imbalance += others;
    double rest = gap - others;
    switch (w.category) {
      case SimCategory::host: b.offload_stall += rest; break;
      case SimCategory::optimizer: b.optimizer += rest; break;
      default: b.exposed_comm += rest; break;
    }
  };
  int32_t last_task = -1;
  for (size_t i = 0; i < r.tasks.size(); ++i) {
    const SimTask& t = r.tasks[i];
    if (t.rep != rep) continue;
    if (last_task < 0 || t.end > r.tasks[static_cast<size_t>(last_task)].end) last_task = static_cast<int32_t>(i);
    if (t.stream != SimStream::compute) continue;
    int32_t binding = -1;
    double latest = -1;
    for (int32_t d : r.deps[i]) {
      const SimTask& dt = r.tasks[static_cast<size_t>(d)];
      if (dt.stream == SimStream::compute && dt.rep == rep) continue;
      if (dt.end > latest) { latest = dt.end; binding = d; }
    }
    attribute(t.start - prev_end, binding);
    if (t.category == SimCategory::optimizer) b.optimizer += t.duration;
    else b.compute += t.duration;
    prev_end = t.end;
  }
  // after the last compute task: the rank's own trailing work (reductions, host optimizer), then waiting for the rest
  double own_end = last_task >= 0 ? r.tasks[static_cast<size_t>(last_task)].end : prev_end;
  if (own_end > prev_end) attribute(own_end - prev_end, last_task);
  if (step > own_end) b.imbalance += step - own_end;
  return b;
}

}  // namespace

SimResult simulate_step_reference(const StepCosts& k, const Plan& p) {
  auto t0 = std::chrono::steady_clock::now();
  SimResult r;
  Builder b(k, p, r);
  b.build();
  run_events(r, b.collectives());
  // step time: the last task anywhere; the critical rank finishes last
  std::vector<double> rep_end(r.reps.size(), 0.0), rep_busy(r.reps.size(), 0.0);
  double fwd_end = 0, bwd_end = 0;
  for (const SimTask& t : r.tasks) {
    rep_end[static_cast<size_t>(t.rep)] = std::max(rep_end[static_cast<size_t>(t.rep)], t.end);
    if (t.stream == SimStream::compute && t.category == SimCategory::compute) rep_busy[static_cast<size_t>(t.rep)] += t.duration;
  }
  double step = 0;
  for (size_t i = 0; i < r.reps.size(); ++i)
    if (rep_end[i] > step) { step = rep_end[i]; r.critical_rep = static_cast<int>(i); }
  r.breakdown_rep = static_cast<int>(std::min_element(rep_busy.begin(), rep_busy.end()) - rep_busy.begin());
  // phases on the critical rank: forward (incl. the loss forward) of each micro-batch, backward, optimizer
  double fwd = 0, opt_start = step;
  std::vector<double> mb_fwd_start(static_cast<size_t>(k.ga), -1), mb_fwd_end(static_cast<size_t>(k.ga), 0);
  for (const SimTask& t : r.tasks) {
    if (t.rep != r.critical_rep) continue;
    if (t.pass == SimPass::optimizer) { opt_start = std::min(opt_start, t.start); continue; }
    size_t mb = static_cast<size_t>(t.micro_batch);
    if (t.pass == SimPass::forward) {
      if (mb_fwd_start[mb] < 0 || t.start < mb_fwd_start[mb]) mb_fwd_start[mb] = t.start;
      mb_fwd_end[mb] = std::max(mb_fwd_end[mb], t.end);
    }
    bwd_end = std::max(bwd_end, t.end);
  }
  for (size_t mb = 0; mb < mb_fwd_end.size(); ++mb) fwd += mb_fwd_end[mb] - std::max(0.0, mb_fwd_start[mb]);
  fwd_end = std::min(fwd, step);
  (void)bwd_end;
  r.time.method = "simulated";
  r.time.step_seconds = step;
  r.time.phase_seconds[static_cast<int>(TimePhase::forward)] = fwd_end;
  r.time.phase_seconds[static_cast<int>(TimePhase::optimizer)] = std::max(0.0, step - opt_start);
  r.time.phase_seconds[static_cast<int>(TimePhase::backward)] =
      std::max(0.0, step - r.time.phase_seconds[0] - r.time.phase_seconds[static_cast<int>(TimePhase::optimizer)]);
  r.time.breakdown = breakdown_of(r, r.breakdown_rep, step);
  finish_step_time(k, r.time);
  r.stats.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace ctx
