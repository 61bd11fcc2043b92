#include "costmodel/simulator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <limits>
#include <unordered_map>

#include "costmodel/process_groups.hpp"
#include "costmodel/ring_backward.hpp"

namespace ctx {

const char* to_string(SimStream s) {
  static const char* names[] = {"compute", "tp", "ring", "dp", "host"};
  return names[static_cast<int>(s)];
}

namespace {

bool same_vector(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::abs(a[i] - b[i]) > 1e-9 * std::max(1e-12, std::abs(a[i]))) return false;
  return true;
}

}  // namespace

bool cp_ranks_alike(const StepCosts& k) {
  for (size_t c = 0; c < k.attn_fwd.size(); ++c)
    for (int64_t r = 1; r < k.cp; ++r)
      if (!same_vector(k.attn_fwd[c][static_cast<size_t>(r)], k.attn_fwd[c][0]) ||
          !same_vector(k.attn_bwd[c][static_cast<size_t>(r)], k.attn_bwd[c][0]))
        return false;
  return true;
}

int64_t ring_steps_per_layer(const StepCosts& k) {
  const int64_t reps = (cp_ranks_alike(k) ? 1 : k.cp) * static_cast<int64_t>(std::max<size_t>(1, k.attn_fwd.size()));
  return reps * std::max<int64_t>(1, k.ring);
}

namespace {

// A task as later tasks see it: what its dependants' start, wait and breakdown attribution need.
// The builder passes these by value instead of task ids, so nothing per task is kept unless the
// tasks are recorded.
struct T {
  double start = 0, end = 0, ready = 0, duration = 0;  // (first: copies move them in aligned pairs)
  int64_t id = -1;  // -1: no task (nothing to wait for); without a recording only compared
  int32_t rep = 0;
  SimStream stream = SimStream::compute;
  SimCategory category = SimCategory::compute;
};
static_assert(sizeof(T) == 48, "a task is six words (the sweep copies many)");

const T kNoTask{};

T task_of(int64_t id, int rep, double start, double end, double ready, double duration, SimStream stream, SimCategory category) {
  T t;
  t.id = id;
  t.rep = rep;
  t.start = start;
  t.end = end;
  t.ready = ready;
  t.duration = duration;
  t.stream = stream;
  t.category = category;
  return t;
}

// Per simulated rank, what the step time, the phases and the breakdown need, accumulated in
// creation order (the order the event-queue version walked the recorded tasks in).
struct RepAcc {
  double end = 0;          // its last task's end
  double busy = 0;         // compute-stream compute time
  double stream_busy = 0;  // compute-stream time of every category (compute and optimizer)
  double fwd_start = -1, fwd_end = 0;  // the current micro-batch's forward span (-1: not started)
  double fwd_sum = 0;      // forward spans of the finished micro-batches, summed
  double opt_start = std::numeric_limits<double>::infinity();
  StepBreakdown b;
  double prev_end = 0;     // end of its previous compute-stream task
  T last;                  // the task that ends last (the first of equals)
};
// Its numbers, for the periodicity check and jump (every one moves along the line the same way).
constexpr double RepAcc::*kRepAccNumbers[] = {&RepAcc::end, &RepAcc::busy, &RepAcc::stream_busy, &RepAcc::fwd_start,
                                              &RepAcc::fwd_end, &RepAcc::fwd_sum, &RepAcc::opt_start, &RepAcc::prev_end};
constexpr double StepBreakdown::*kBreakdownNumbers[] = {&StepBreakdown::compute, &StepBreakdown::exposed_comm, &StepBreakdown::offload_stall,
                                                        &StepBreakdown::imbalance, &StepBreakdown::optimizer};

// Builds the task graph: the same program for every simulated rank, generated in lockstep so
// that collectives get one id across their members. Every task's start and end are known when it
// is created: its dependencies were all created (and timed) before it.
class Builder {
 public:
  Builder(const StepCosts& k, const Plan& p, SimResult& out, bool record, int ring_closed_form_min_ranks, int partial_sweep_min_ranks,
          bool predict_line_ends, SimProfile* profile)
      : k_(k), p_(p), out_(out), record_(record), ring_closed_form_min_ranks_(ring_closed_form_min_ranks),
        partial_min_ranks_(partial_sweep_min_ranks), predict_line_ends_(predict_line_ends), profile_(profile) {}

  void build() {
    choose_reps();
    const int R = static_cast<int>(out_.reps.size());
    last_.assign(static_cast<size_t>(R) * kSimStreams, T{});
    acc_.assign(static_cast<size_t>(R), RepAcc{});
    auto micro_batch = [&](int64_t mb) {
      mb_ = mb;
      const bool reduce = k_.grad_reduce_every_microbatch || mb + 1 == k_.ga;
      for (RepAcc& a : acc_) a.fwd_start = -1, a.fwd_end = 0;
      forward();
      loss(reduce);
      for (RepAcc& a : acc_) a.fwd_sum += a.fwd_end - std::max(0.0, a.fwd_start);  // the forward span is complete
      backward(reduce);
    };
    // micro-batches 1 .. ga-2 are alike (the first starts from nothing, the last reduces the
    // gradients unless every one does): identical micro-batches are the periodic case of Period
    Period period(true);
    for (int64_t mb = 0; mb < k_.ga; ++mb) {
      micro_batch(mb);
      if (!record_ && mb + 2 < k_.ga) {
        const int64_t n = (k_.ga - 2) - mb;
        if (period.observe(*this, {&mb_end_, &reduce_end_}) && n >= 2)
          mb += period.jump(*this, {&mb_end_, &reduce_end_}, n, [&](int64_t m) { as(SimLayerRun::probe, [&] { micro_batch(mb + m); }); });
      }
    }
    mb_ = k_.ga - 1;
    optimizer();
  }

 private:
  // ---- the layer profile (simulate_step's `profile`) -------------------------------------------
  // runs `f` as an iteration of kind `kind` (probes and partial layers, and the layers inside them)
  template <class F>
  void as(SimLayerRun::Kind kind, F&& f) {
    const SimLayerRun::Kind before = run_kind_;
    if (before == SimLayerRun::swept) run_kind_ = kind;
    f();
    run_kind_ = before;
  }
  // runs one layer iteration `f`, recorded where a profile is asked for
  template <class F>
  void profiled(SimPass pass, int32_t layer, F&& f) {
    if (!profile_) {
      f();
      return;
    }
    const double t0 = thread_cpu_seconds();
    const int64_t computed = ring_computed_, moved = ring_moved_, gave_way = ring_gave_way_;
    f();
    SimLayerRun run;
    run.kind = run_kind_;
    run.pass = pass;
    run.layer = layer;
    run.micro_batch = mb_;
    run.cpu_s = thread_cpu_seconds() - t0;
    run.swept_ranks = partial_ ? static_cast<int64_t>(std::count(sweep_.begin(), sweep_.end(), 1)) : nreps();
    run.ring_computed = ring_computed_ - computed;
    run.ring_moved = ring_moved_ - moved;
    run.ring_gave_way = ring_gave_way_ - gave_way;
    profile_->runs.push_back(run);
  }

  // ---- reps -------------------------------------------------------------------------------
  void choose_reps() {
    const size_t classes = k_.attn_fwd.size();
    const int64_t cp = k_.cp;
    const bool symmetric = cp_ranks_alike(k_);
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
  // Creates a task after `deps` (and the previous task of its stream). A task outside a collective
  // is timed at once; a collective member (coll >= 0) is left pending, with its own readiness in
  // `start`, and timed by `collective` once all members exist.
  // The task is written into `out` (which may be one of `deps`: they are read first), field by
  // field: a T assembled in memory and copied whole at once would stall store-to-load forwarding.
  [[gnu::always_inline]] void add(T& out, int rep, SimStream s, const char* name, double dur, SimPass pass, SimCategory cat, int32_t layer,
           std::initializer_list<const T*> deps, int32_t coll = -1) {
    const int64_t id = next_id_++;
    if (partial_ && !sweep_[static_cast<size_t>(rep)]) {  // a rank on its line (partial sweep): its id only
      out.id = id;
      out.rep = rep;
      return;
    }
    const double duration = std::max(0.0, dur);
    T& slot = last_[static_cast<size_t>(rep) * kSimStreams + static_cast<int>(s)];
    const T& prev = slot;
    const int64_t prev_id = prev.id;
    double full_ready = 0, ready = 0;
    const T* binding = &kNoTask;  // for the breakdown: the latest dependency that is not the rank's own compute
    double latest = -1;
    // the previous task of the stream, then `deps` (as the recorded dependency list orders them)
    for (const T *x = &prev, *const *it = deps.begin();; x = *it++) {
      if (x->id >= 0) {
        full_ready = std::max(full_ready, x->end);
        if (x->rep == rep) ready = std::max(ready, x->end);
        if (s == SimStream::compute && !(x->stream == SimStream::compute && x->rep == rep) && x->end > latest) {
          latest = x->end;
          binding = x;
        }
      }
      if (it == deps.end()) break;
    }
    if (margins_.on) tape_margin(prev, deps);
    if (record_) {
      SimTask st;
      st.name = name;
      st.duration = duration;
      st.ready = ready;
      st.rep = rep;
      st.layer = layer;
      st.micro_batch = static_cast<int32_t>(mb_);
      st.collective = coll;
      st.stream = s;
      st.pass = pass;
      st.category = cat;
      out_.tasks.push_back(st);
      std::vector<int32_t> d;
      if (prev_id >= 0) d.push_back(static_cast<int32_t>(prev_id));  // in-order stream
      for (const T* x : deps)
        if (x->id >= 0) d.push_back(static_cast<int32_t>(x->id));
      out_.deps.push_back(std::move(d));
    }
    if (coll >= 0) {  // pending: its own readiness in `start`
      put(slot, id, rep, full_ready, -1, ready, duration, s, cat);
      put(out, id, rep, full_ready, -1, ready, duration, s, cat);
      return;
    }
    const T b = *binding;  // (finish overwrites `prev`)
    finish(out, id, rep, full_ready, ready, duration, s, cat, pass, b);
  }

  // Tapes how far the runner-up among a task's dependencies' ends is below the latest (Margins);
  // nothing where fewer than two different tasks (the stream's previous task is often the
  // dependency too).
  [[gnu::always_inline]] void tape_margin(const T& prev, std::initializer_list<const T*> deps) {
    double first = -1, second = -1;  // (ends are >= 0)
    int64_t first_id = -1;
    for (const T *x = &prev, *const *it = deps.begin();; x = *it++) {
      if (x->id >= 0 && x->id != first_id) {
        if (x->end > first) second = first, first = x->end, first_id = x->id;
        else second = std::max(second, x->end);
      }
      if (it == deps.end()) break;
    }
    if (second >= 0) margins_.put(first - second);
  }

  // Writes a task field by field (see add).
  [[gnu::always_inline]] static void put(T& d, int64_t id, int rep, double start, double end, double ready, double duration, SimStream s,
                                         SimCategory c) {
    d.start = start;
    d.end = end;
    d.ready = ready;
    d.duration = duration;
    d.id = id;
    d.rep = rep;
    d.stream = s;
    d.category = c;
  }

  // Times the task at `start`, keeps it as its stream's last (and in `out`) and accounts it to its rank.
  [[gnu::always_inline]] void finish(T& out, int64_t id, int rep, double start, double ready, double duration, SimStream s, SimCategory c,
                                     SimPass pass, const T& binding) {
    const double end = start + duration;
    put(last_[static_cast<size_t>(rep) * kSimStreams + static_cast<int>(s)], id, rep, start, end, ready, duration, s, c);
    put(out, id, rep, start, end, ready, duration, s, c);
    ++ntasks_;
    if (record_) {
      SimTask& st = out_.tasks[static_cast<size_t>(id)];
      st.start = start;
      st.end = end;
    }
    RepAcc& a = acc_[static_cast<size_t>(rep)];
    a.end = std::max(a.end, end);
    if (a.last.id < 0 || end > a.last.end) put(a.last, id, rep, start, end, ready, duration, s, c);
    if (s == SimStream::compute) {
      if (c == SimCategory::compute) a.busy += duration;
      a.stream_busy += duration;
      attribute(a.b, rep, start - a.prev_end, binding);
      if (c == SimCategory::optimizer) a.b.optimizer += duration;
      else a.b.compute += duration;
      a.prev_end = end;
    }
    if (pass == SimPass::optimizer) {
      a.opt_start = std::min(a.opt_start, start);
    } else if (pass == SimPass::forward) {
      if (a.fwd_start < 0 || start < a.fwd_start) a.fwd_start = start;
      a.fwd_end = std::max(a.fwd_end, end);
    }
  }

 public:
  // Where an idle gap of rank `rep`'s compute stream went: to what it waited for (`w`, the
  // dependency that finished last; none: imbalance).
  static void attribute(StepBreakdown& b, int rep, double gap, const T& w) {
    if (gap <= 0) return;
    if (w.id < 0) { b.imbalance += gap; return; }
    double others = w.rep != rep ? gap : std::min(gap, std::max(0.0, w.start - w.ready));  // waited for other ranks
    b.imbalance += others;
    double rest = gap - others;
    switch (w.category) {
      case SimCategory::host: b.offload_stall += rest; break;
      case SimCategory::optimizer: b.optimizer += rest; break;
      default: b.exposed_comm += rest; break;
    }
  }

 private:
  int32_t new_collective() { return static_cast<int32_t>(next_coll_++); }  // (recorded ids only)

  // A collective over a group: members are the simulated reps with the same group key. They start
  // together, when the last of them is ready.
  enum class G { self, ulysses, cp, zero };
  // (Each rank's task is written over its dependency in `ids`, which the caller hands over: pass it
  // with std::move where it is not needed again, and no row is copied.)
  std::vector<T> collective(G g, SimStream s, const char* name, double dur, SimPass pass, int32_t layer, std::vector<T> ids) {
    if (dur <= 0) return ids;  // nothing to wait for: later tasks depend on what this would have
    if (g == G::self) {  // one member each (TP ranks are collapsed): timed at once
      for (int r = 0; r < nreps(); ++r)
        add(ids[static_cast<size_t>(r)], r, s, name, dur, pass, SimCategory::comm, layer, {&ids[static_cast<size_t>(r)]});
      return ids;
    }
    std::vector<int32_t>& coll_of_key = coll_of_key_;
    std::vector<int32_t>& key_of = key_of_;
    std::vector<double>& arrival = arrival_;
    coll_of_key.assign(static_cast<size_t>(nreps()) + 1, -1);
    key_of.assign(static_cast<size_t>(nreps()), 0);
    arrival.assign(static_cast<size_t>(nreps()) + 1, 0.0);
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
      key_of[static_cast<size_t>(r)] = key;
      int32_t c = -1;
      if (g != G::self) {
        if (coll_of_key[static_cast<size_t>(key)] < 0) coll_of_key[static_cast<size_t>(key)] = new_collective();
        c = coll_of_key[static_cast<size_t>(key)];
      }
      add(ids[static_cast<size_t>(r)], r, s, name, dur, pass, SimCategory::comm, layer, {&ids[static_cast<size_t>(r)]}, c);
      if (c >= 0 && !(partial_ && !sweep_[static_cast<size_t>(r)]))
        arrival[static_cast<size_t>(key)] = std::max(arrival[static_cast<size_t>(key)], ids[static_cast<size_t>(r)].start);
    }
    if (margins_.on)  // how far each member's readiness is below the collective's start
      for (int r = 0; r < nreps(); ++r)
        margins_.put(arrival[static_cast<size_t>(key_of[static_cast<size_t>(r)])] - ids[static_cast<size_t>(r)].start);
    if (taping_ || partial_) joined(g, ids, arrival);
    if (g != G::self)
      for (int r = 0; r < nreps(); ++r) {
        if (partial_ && !sweep_[static_cast<size_t>(r)]) continue;
        T& m = ids[static_cast<size_t>(r)];
        finish(m, m.id, m.rep, arrival[static_cast<size_t>(key_of[static_cast<size_t>(r)])], m.ready, m.duration, m.stream, m.category, pass, T{});
      }
    return ids;
  }
  // (compute and host write over their first dependency's row too, as collective; `dep_b` must be
  // another row)
  std::vector<T> compute(const char* name, double dur, SimPass pass, int32_t layer, std::vector<T> ids,
                               const std::vector<T>* dep_b = nullptr, SimCategory cat = SimCategory::compute) {
    for (int r = 0; r < nreps(); ++r)
      add(ids[static_cast<size_t>(r)], r, SimStream::compute, name, dur, pass, cat, layer,
                                        {&ids[static_cast<size_t>(r)], dep_b ? &(*dep_b)[static_cast<size_t>(r)] : &kNoTask});
    return ids;
  }
  std::vector<T> host(const char* name, double dur, SimPass pass, int32_t layer, std::vector<T> ids,
                            SimCategory cat = SimCategory::host) {
    if (dur <= 0) return ids;
    for (int r = 0; r < nreps(); ++r)
      add(ids[static_cast<size_t>(r)], r, SimStream::host, name, dur, pass, cat, layer, {&ids[static_cast<size_t>(r)]});
    return ids;
  }
  // a vector of no tasks, one per rep (copied from one built once: a copy is a block move, where
  // constructing R tasks stores each field)
  std::vector<T> none() {
    if (none_.size() != static_cast<size_t>(nreps())) none_.assign(static_cast<size_t>(nreps()), T{});
    return none_;
  }

  // the partial sums of a row-parallel output over TP: reduce-scatter under SP, else all-reduce
  std::vector<T> tp_reduce(SimPass pass, int32_t layer, std::vector<T> after) {
    // (layer < 0: around the layers, the *_ends values, which tp_overlap leaves on the TP stream)
    return k_.sp ? collective(G::self, SimStream::tp, "tp_reduce_scatter", layer < 0 ? k_.tp_rs_ends : k_.tp_rs, pass, layer, std::move(after))
                 : collective(G::self, SimStream::tp, "tp_all_reduce", layer < 0 ? k_.tp_ar_ends : k_.tp_ar, pass, layer, std::move(after));
  }
  std::vector<T> tp_gather(SimPass pass, int32_t layer, std::vector<T> after) {
    return k_.sp ? collective(G::self, SimStream::tp, "tp_all_gather", layer < 0 ? k_.tp_ag_ends : k_.tp_ag, pass, layer, std::move(after))
                 : after;
  }
  // gradients TP ranks hold partial sums of, summed before the unit's reduction
  std::vector<T> tp_fixups(int32_t layer, int norms, int kvs, std::vector<T> d) {
    for (int i = 0; i < norms; ++i)
      d = collective(G::self, SimStream::tp, "tp_grad_fixup", k_.tp_fixup_norm, SimPass::backward, layer, std::move(d));
    for (int i = 0; i < kvs; ++i)
      d = collective(G::self, SimStream::tp, "tp_grad_fixup", k_.tp_fixup_kv, SimPass::backward, layer, std::move(d));
    return d;
  }

  // ---- attention core ---------------------------------------------------------------------------
  std::vector<T> attention(SimPass pass, int32_t layer, std::vector<T> after, bool backward) {
    const char* name = backward ? "attention_bwd" : pass == SimPass::recompute ? "attention_recompute" : "attention";
    const bool ring_kind = (k_.cp_kind == CpKind::ring || k_.cp_kind == CpKind::zigzag || k_.cp_kind == CpKind::usp) && k_.ring > 1;
    const std::vector<const std::vector<double>*>& cost_of = ring_costs(backward);  // per rep
    const std::vector<double>& first_cost = ring_first_cost_[backward ? 1 : 0];       // (their step 0)
    auto cost = [&](int r, size_t step) {
      if (step == 0) return first_cost[static_cast<size_t>(r)];
      const auto& v = *cost_of[static_cast<size_t>(r)];
      return step < v.size() ? v[step] : 0.0;
    };
    if (!ring_kind) {
      std::vector<T> ids = std::move(after);
      if (k_.cp_kind == CpKind::allgather && k_.kv_ag > 0)
        ids = collective(G::cp, SimStream::tp, "kv_all_gather", k_.kv_ag, pass, layer, std::move(ids));
      for (int r = 0; r < nreps(); ++r)
        add(ids[static_cast<size_t>(r)], r, SimStream::compute, name, cost(r, 0), pass, SimCategory::compute, layer, {&ids[static_cast<size_t>(r)]});
      if (backward && k_.cp_kind == CpKind::allgather && k_.dkv_rs > 0)
        ids = collective(G::cp, SimStream::tp, "dkv_reduce_scatter", k_.dkv_rs, pass, layer, std::move(ids));
      return ids;
    }
    // K,V of the next step travel while this step computes. In the backward each block's dK,dV
    // travel with it too: rank r receives a block's partial sum from its neighbour once that
    // neighbour has computed its step and summed what it had received itself; r adds it after its
    // own compute of the block (the hop overlaps that compute), and after the last step each
    // block's total hops home to its owner.
    std::vector<T> have = std::move(after);  // when each rank holds the block it will send next
    std::vector<T> have_dkv = none();
    std::vector<T> last_compute = none();
    const std::vector<int>& prev = ring_senders();
    auto prev_of = [&](int r) { return prev[static_cast<size_t>(r)]; };
    const int64_t steps = k_.ring;
    // without a recording, the steps after the first (whose dependencies are all tasks of this
    // loop) run on flat arrays: ring_backward
    const int64_t generic_steps = record_ ? steps : 1;
    for (int64_t j = 0; j < generic_steps; ++j) {
      std::vector<T> recv = none();
      const bool tape = !backward && j == 0 && (taping_ || partial_);  // (a forward layer of the partial sweep's loop)
      if (tape) first_step_in(have);
      if (j + 1 < steps) {
        for (int r = 0; r < nreps(); ++r)
          add(recv[static_cast<size_t>(r)], r, SimStream::ring, "ring_kv", k_.p2p_fwd, pass, SimCategory::comm, layer,
                                             {&have[static_cast<size_t>(r)], &have[static_cast<size_t>(prev_of(r))]});
      }
      if (tape) first_step_out(recv, j + 1 < steps);
      for (int r = 0; r < nreps(); ++r)
        add(last_compute[static_cast<size_t>(r)], r, SimStream::compute, name, cost(r, static_cast<size_t>(j)), pass, SimCategory::compute,
                                                   layer, {&have[static_cast<size_t>(r)]});
      if (backward) {
        std::vector<T> dkv = none();
        for (int r = 0; r < nreps(); ++r) {
          const int prev = prev_of(r);
          add(dkv[static_cast<size_t>(r)], r, SimStream::ring, "ring_dkv", k_.p2p_dkv, pass, SimCategory::comm, layer,
                                            {&last_compute[static_cast<size_t>(prev)], &have_dkv[static_cast<size_t>(prev)]});
        }
        have_dkv.swap(dkv);
      }
      if (j + 1 < steps) have.swap(recv);
    }
    if (generic_steps < steps) {
      if (backward) ring_backward(generic_steps, steps, cost_of, prev, have, have_dkv, last_compute);
      else ring_forward_by_rank(pass, steps, cost_of, prev, have, last_compute);
    }
    if (!backward) return last_compute;
    // dq is done with the last compute, dK,dV with the hop home
    for (int r = 0; r < nreps(); ++r)
      add(last_compute[static_cast<size_t>(r)], r, SimStream::compute, "ring_dkv_sum", 0.0, pass, SimCategory::compute, layer,
              {&last_compute[static_cast<size_t>(r)], &have_dkv[static_cast<size_t>(r)]});
    return last_compute;
  }

  // Per rep, its attention cost per ring step (the forward's or the backward's) and the ring
  // neighbour that sends to it: fixed for the step, worked out once (a modulo per rank and ring
  // step was ~2% of a 256-rank ring's simulation).
  // (Also each rep's step-0 and last-step costs in one array each, ring_first_cost_ and
  // ring_last_cost_: read from the vectors, one page each, they were a cache and TLB miss per rank
  // and layer.)
  const std::vector<const std::vector<double>*>& ring_costs(bool backward) {
    std::vector<const std::vector<double>*>& v = ring_cost_of_[backward ? 1 : 0];
    if (v.empty()) {
      const auto& costs = backward ? k_.attn_bwd : k_.attn_fwd;
      std::vector<double> &first = ring_first_cost_[backward ? 1 : 0], &last = ring_last_cost_[backward ? 1 : 0];
      const size_t lj = static_cast<size_t>(std::max<int64_t>(0, k_.ring - 1));
      for (const SimRep& rep : out_.reps) {
        v.push_back(&costs[static_cast<size_t>(rep.pack_class)][static_cast<size_t>(rep.cp_index)]);
        const std::vector<double>& cv = *v.back();
        first.push_back(cv.empty() ? 0.0 : cv.front());
        last.push_back(std::max(0.0, lj < cv.size() ? cv[lj] : 0.0));
      }
    }
    return v;
  }
  const std::vector<int>& ring_senders() {
    if (ring_sender_.empty())
      for (const SimRep& rep : out_.reps)
        ring_sender_.push_back(rep_index(rep.pack_class, (rep.cp_index - k_.ulysses + k_.cp) % k_.cp));
    return ring_sender_;
  }

  // Backward ring steps [j0, steps) without a recording (costmodel/ring_backward.hpp): the tasks
  // of the generic loop above (ring_kv, the step's compute, ring_dkv), with the same ids,
  // accounting and breakdown, from the state after step j0 - 1 (`have`, `have_dkv`,
  // `last_compute`, updated); every dependency of these steps is a task of this loop. Rings of
  // at least ring_closed_form_min_ranks_ ranks go rank by rank in closed form; smaller ones, and
  // every later layer once the closed form has given way, are swept step by step on flat arrays.
  // Equal to the generic loop up to rounding.
  void ring_backward(int64_t j0, int64_t steps, const std::vector<const std::vector<double>*>& cost_of, const std::vector<int>& prev,
                     const std::vector<T>& have, std::vector<T>& have_dkv, std::vector<T>& last_compute) {
    const int R = nreps();
    const size_t n = static_cast<size_t>(R);
    ring_in_.resize(n);
    for (size_t r = 0; r < n; ++r) {
      RingBackwardRank& x = ring_in_[r];
      const RepAcc& a = acc_[r];
      const T& ring = last_[r * kSimStreams + static_cast<int>(SimStream::ring)];
      x.cost = cost_of[r];
      x.prev = prev[r];
      x.have_start = have[r].start, x.have_end = have[r].end, x.have_ready = have[r].ready;
      x.dkv_valid = have_dkv[r].id >= 0;
      x.dkv_end = x.dkv_valid ? have_dkv[r].end : 0.0;
      x.compute_end = last_compute[r].end;
      x.prev_end = a.prev_end;
      x.ring_end = ring.id >= 0 ? ring.end : 0.0;
      x.best_end = a.last.id >= 0 ? a.last.end : -std::numeric_limits<double>::infinity();
    }
    const int period_before = ring_work_.period;
    const bool try_closed = R >= ring_closed_form_min_ranks_ && !ring_closed_form_failed_;
    const bool closed = try_closed && ring_backward_closed_form(j0, steps, k_.p2p_fwd, k_.p2p_dkv, ring_in_, ring_out_, ring_work_);
    if (profile_ && try_closed) {  // (each store counts its own last call: the lines', then the staircases' where lines gave way)
      if (period_before == 1) ring_computed_ += ring_work_.lines.computed, ring_moved_ += ring_work_.lines.reused;
      if (ring_work_.period == 2) ring_computed_ += ring_work_.stairs.computed, ring_moved_ += ring_work_.stairs.reused;
      ring_gave_way_ += !closed;
    }
    if (!closed) {
      // (the later layers are alike: not tried again. Also where it gave way in a jump's check, a
      // state placed on a line that may not hold: tried again after such a check, the 1024-GPU
      // space's plain rings of 256 ranks without recompute took 1.13-1.15x the CPU time, the
      // closed form giving way again a few layers later; `bench_simulator --one` with
      // CTX_BENCH_LAYERS=1 marks where it gives way)
      ring_closed_form_failed_ = R >= ring_closed_form_min_ranks_;
      ring_backward_sweep(j0, steps, k_.p2p_fwd, k_.p2p_dkv, ring_in_, ring_out_, ring_work_.sweep);
    }
    const double p2p = std::max(0.0, k_.p2p_fwd), p2p_dkv = std::max(0.0, k_.p2p_dkv);
    const int64_t id0 = next_id_;
    int64_t created = 0;
    for (int64_t i = j0; i < steps; ++i) created += (i + 1 < steps ? 3 : 2) * static_cast<int64_t>(R);
    const std::vector<double>& last_cost = ring_last_cost_[1];  // (ring_costs: steps is k_.ring)
    next_id_ = id0 + created;
    ntasks_ += created;
    // the ids of the generic loop: step j creates receives (if any), computes, hops, R each
    auto make = [&](size_t r, RingBackwardResult::Role role, int64_t j, double start, double end, double ready) {
      const int64_t before = (j - j0) * 3 * static_cast<int64_t>(R);  // steps j0 .. j-1 all have receives
      const bool has_recv = j + 1 < steps;
      const int64_t block = role == RingBackwardResult::recv ? 0 : role == RingBackwardResult::compute ? (has_recv ? R : 0) : (has_recv ? 2 * R : R);
      auto cost = [&] {  // (the last step's from ring_costs' array: a read of the vector is a cache miss per rank)
        if (j == steps - 1) return last_cost[r];
        const std::vector<double>& cv = *cost_of[r];
        return std::max(0.0, static_cast<size_t>(j) < cv.size() ? cv[static_cast<size_t>(j)] : 0.0);
      };
      const double dur = role == RingBackwardResult::recv ? p2p : role == RingBackwardResult::dkv ? p2p_dkv : cost();
      return task_of(id0 + before + block + static_cast<int64_t>(r), static_cast<int>(r), start, end, ready, dur,
                     role == RingBackwardResult::compute ? SimStream::compute : SimStream::ring,
                     role == RingBackwardResult::compute ? SimCategory::compute : SimCategory::comm);
    };
    const int64_t last_j = steps - 1;
    for (size_t r = 0; r < n; ++r) {
      const RingBackwardResult& o = ring_out_[r];
      RepAcc& a = acc_[r];
      a.busy += o.busy_s;
      a.stream_busy += o.busy_s;
      a.b.compute += o.busy_s;
      a.b.imbalance += o.imbalance_s;
      a.b.exposed_comm += o.exposed_s;
      a.prev_end = o.c_end;
      if (o.best_role != RingBackwardResult::none) {
        a.end = std::max(a.end, o.best_end);
        a.last = make(r, o.best_role, o.best_j, o.best_start, o.best_end, o.best_ready);
      }
      const T c = make(r, RingBackwardResult::compute, last_j, o.c_start, o.c_end, o.c_start);
      last_compute[r] = c;
      last_[r * kSimStreams + static_cast<int>(SimStream::compute)] = c;
      const T d = make(r, RingBackwardResult::dkv, last_j, o.d_start, o.d_end, o.d_ready);
      have_dkv[r] = d;
      last_[r * kSimStreams + static_cast<int>(SimStream::ring)] = d;
    }
  }

  // Where the cost of a rank's ring steps changes: the starts of its runs of equal cost over
  // steps [0, steps), 0 first, and each run's cost (max(0, value); 0 past the vector), so the
  // sweep never reads the R^2 cost values again (one rank's vector is a page of its own: a read per
  // rank and layer was a cache and TLB miss each). The cost vectors are the same in every layer:
  // computed once each.
  struct CostRuns {
    std::vector<int64_t> starts;
    std::vector<double> costs;
    double at(int64_t j) const {  // the cost of step j in [0, steps)
      return costs[static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), j) - starts.begin()) - 1];
    }
  };
  const CostRuns& cost_runs(const std::vector<double>* cv, int64_t steps) {
    auto it = cost_runs_.find(cv);
    if (it != cost_runs_.end()) return it->second;
    // (the raw values' runs, merged where their costs are equal)
    run_starts(*cv, raw_starts_);
    CostRuns runs;
    double before = 0;
    auto at = [&](int64_t j) {
      const double c = std::max(0.0, static_cast<size_t>(j) < cv->size() ? (*cv)[static_cast<size_t>(j)] : 0.0);
      if (j == 0 || c != before) runs.starts.push_back(j), runs.costs.push_back(c);
      before = c;
    };
    for (int64_t j : raw_starts_)
      if (j < steps) at(j);
    if (static_cast<int64_t>(cv->size()) < steps) at(std::max<int64_t>(0, static_cast<int64_t>(cv->size())));
    return cost_runs_.emplace(cv, std::move(runs)).first->second;
  }

  // For every rank x, the nearest rank upstream of it (walking `prev`) whose value is strictly
  // greater, and how many hops away (none: -1): the records of the running maximum a walk
  // upstream meets. Per cycle of `prev`, a monotonic stack over the cycle walked twice: O(R).
  void next_greater_upstream(const std::vector<int>& prev, const std::vector<double>& value, std::vector<int>& ng,
                             std::vector<int64_t>& ng_hops) {
    const size_t n = prev.size();
    ng.assign(n, -1);
    ng_hops.assign(n, -1);
    std::vector<char>& seen = ng_seen_;  // (scratch kept between layers)
    std::vector<int>& cycle = ng_cycle_;
    std::vector<NgEntry>& stack = ng_stack_;
    seen.assign(n, 0);
    for (size_t x0 = 0; x0 < n; ++x0) {
      if (seen[x0]) continue;
      cycle.clear();
      for (int x = static_cast<int>(x0); !seen[static_cast<size_t>(x)]; x = prev[static_cast<size_t>(x)]) {
        seen[static_cast<size_t>(x)] = 1;
        cycle.push_back(x);
      }
      const int64_t L = static_cast<int64_t>(cycle.size());
      stack.clear();
      for (int64_t i = 2 * L - 1; i >= 0; --i) {  // (entries carry the rank and value: no division per step)
        const int x = cycle[static_cast<size_t>(i >= L ? i - L : i)];
        const double vx = value[static_cast<size_t>(x)];
        while (!stack.empty() && stack.back().value <= vx) stack.pop_back();
        if (i < L && !stack.empty()) {
          ng[static_cast<size_t>(x)] = stack.back().rank;
          ng_hops[static_cast<size_t>(x)] = stack.back().pos - i;
        }
        stack.push_back({i, x, vx});
      }
    }
  }

  // The first receives' ends along `prev`'s cycles, walked upstream, as flat positions: each
  // cycle laid out twice (pos0[r] + h is the rank h hops upstream of r, h < its cycle's length),
  // with sparse tables for three range queries in O(1) and O(log R): the first position of the
  // largest value, the first position whose value exceeds the one before it by no more than d, and
  // (after tilt(d)) the first position whose value less d per position exceeds a threshold.
  // ring_forward_by_rank walks a rank's running maximum rise by rise; where it rises at almost
  // every hop (upstream ranks ready ever later: the recompute pass of a long causal ring, ~R^2/4
  // rises per layer at R = 1024) these queries take a whole stretch of rises at once.
  struct Upstream {
    std::vector<int> walk;        // the rank at a position
    std::vector<int64_t> pos0;    // per rank: its own position (hop 0)
    std::vector<int64_t> len;     // per rank: its cycle's length (no rise is more hops away than len - 1)
    std::vector<double> value;    // first end at a position
    std::vector<std::vector<double>> rise_min;  // [level][pos]: min over [pos, pos + 2^level) of value[i] - value[i - 1]
    std::vector<std::vector<int>> max_at;       // [level][pos]: first position of the max over [pos, pos + 2^level)
    bool built = false;

    void build(const std::vector<int>& prev, const std::vector<double>& first_end) {
      const size_t n = prev.size();
      walk.clear();
      pos0.assign(n, -1);
      len.assign(n, 0);
      for (size_t x0 = 0; x0 < n; ++x0) {
        if (pos0[x0] >= 0) continue;
        const size_t base = walk.size();
        for (int x = static_cast<int>(x0); pos0[static_cast<size_t>(x)] < 0; x = prev[static_cast<size_t>(x)]) {
          pos0[static_cast<size_t>(x)] = static_cast<int64_t>(walk.size());
          walk.push_back(x);
        }
        const size_t L = walk.size() - base;
        for (size_t i = 0; i < L; ++i) {
          len[static_cast<size_t>(walk[base + i])] = static_cast<int64_t>(L);
          walk.push_back(walk[base + i]);
        }
      }
      const size_t N = walk.size();
      value.resize(N);
      for (size_t i = 0; i < N; ++i) value[i] = first_end[static_cast<size_t>(walk[i])];
      size_t levels = 1;
      while ((size_t{1} << levels) <= N) ++levels;
      rise_min.resize(levels);
      max_at.resize(levels);
      rise_min[0].resize(N);
      max_at[0].resize(N);
      for (size_t i = 0; i < N; ++i) {
        // (a cycle's first position has no position before it: never asked for)
        rise_min[0][i] = i == 0 ? std::numeric_limits<double>::infinity() : value[i] - value[i - 1];
        max_at[0][i] = static_cast<int>(i);
      }
      for (size_t l = 1; l < levels; ++l) {
        const size_t h = size_t{1} << (l - 1), w = size_t{1} << l;
        rise_min[l].resize(N);
        max_at[l].resize(N);
        for (size_t i = 0; i + w <= N; ++i) {
          rise_min[l][i] = std::min(rise_min[l - 1][i], rise_min[l - 1][i + h]);
          const int x = max_at[l - 1][i], y = max_at[l - 1][i + h];
          max_at[l][i] = value[static_cast<size_t>(y)] > value[static_cast<size_t>(x)] ? y : x;
        }
      }
      built = true;
      tilted_slope = std::numeric_limits<double>::quiet_NaN();  // (the tilted table is of the values before)
    }
    // the first position of the largest value in [a, b] (a <= b)
    int64_t argmax(int64_t a, int64_t b) const {
      size_t l = 0;
      while ((int64_t{2} << l) <= b - a + 1) ++l;
      const int x = max_at[l][static_cast<size_t>(a)], y = max_at[l][static_cast<size_t>(b - (int64_t{1} << l) + 1)];
      return value[static_cast<size_t>(y)] > value[static_cast<size_t>(x)] ? y : x;
    }
    // the first position i in [a, b] with value[i] - value[i - 1] <= d (b + 1: none)
    int64_t first_rise_at_most(int64_t a, int64_t b, double d) const {
      int64_t i = a;
      for (size_t l = rise_min.size(); l-- > 0;) {
        const int64_t w = int64_t{1} << l;
        if (i + w - 1 <= b && rise_min[l][static_cast<size_t>(i)] > d) i += w;
      }
      return i;
    }
    // value less a slope per position: (after built) the sparse table of max over [pos, pos + 2^level)
    // of value[i] - slope i, for first_above; rebuilt when asked for another slope
    std::vector<std::vector<double>> tilted_max;
    double tilted_slope = std::numeric_limits<double>::quiet_NaN();
    void tilt(double slope) {
      if (slope == tilted_slope && tilted_max.size() == rise_min.size()) return;
      const size_t N = value.size(), levels = rise_min.size();
      tilted_max.resize(levels);
      tilted_max[0].resize(N);
      for (size_t i = 0; i < N; ++i) tilted_max[0][i] = value[i] - slope * static_cast<double>(i);
      for (size_t l = 1; l < levels; ++l) {
        const size_t h = size_t{1} << (l - 1), w = size_t{1} << l;
        tilted_max[l].resize(N);
        for (size_t i = 0; i + w <= N; ++i) tilted_max[l][i] = std::max(tilted_max[l - 1][i], tilted_max[l - 1][i + h]);
      }
      tilted_slope = slope;
    }
    // the first position i in [a, b] with value[i] - slope i > t, for the slope of the last tilt (b + 1: none)
    int64_t first_above(int64_t a, int64_t b, double t) const {
      int64_t i = a;
      for (size_t l = tilted_max.size(); l-- > 0;) {
        const int64_t w = int64_t{1} << l;
        if (i + w - 1 <= b && tilted_max[l][static_cast<size_t>(i)] <= t) i += w;
      }
      return i;
    }
  };

  // Forward ring steps 1 .. steps-1 without a recording, one rank at a time. In the forward the
  // transfers wait for nothing but transfers (K,V travel while the step computes), so the block
  // rank r receives at step k >= 1 arrives at  M_k + k p,  M_k = the latest end of the first
  // step's receive over r and its k upstream neighbours (p: one hop). M_k only changes where the
  // walk upstream meets a new maximum (next_greater_upstream), and a rank's step costs come in
  // runs (cost_runs), so each rank's steps fall into segments of equal cost and equal M, and a
  // segment is closed-form: its computes wait for their blocks (arrivals p apart, computes c
  // apart) either never after its first step (c >= p: once the compute leads it stays ahead) or
  // from some step on (c < p: once a block is late, every later one is). Per rank O(segments)
  // instead of O(steps), with the same tasks, ids, accounting and breakdown as the generic loop;
  // equal to it up to rounding (M_k + k p and n c are one product where the loop adds k or n
  // times; tests/test_simulator_oracle.cpp holds it to 1e-9 relative). What finish() tracks per
  // task comes from the two sequences' ends, which never decrease: the receives' (M_k + k p) and
  // the computes' (each starts after the previous one ends). The task ending last is the first
  // (in creation order) to reach the larger final end; the forward span runs from the earlier of
  // the two first starts to that end.
  // `have` holds the first step's receives, `last_compute` the first step's computes.
  void ring_forward_by_rank(SimPass pass, int64_t steps, const std::vector<const std::vector<double>*>& cost_of,
                            const std::vector<int>& prev, const std::vector<T>& have, std::vector<T>& last_compute) {
    const int R = nreps();
    const double p2p = std::max(0.0, k_.p2p_fwd);
    const int64_t id0 = next_id_;
    // step j >= 1 creates (j + 1 < steps ? R receives : nothing), then R computes
    auto recv_id = [&](int64_t j, int r) { return id0 + 2 * R * (j - 1) + r; };
    auto comp_id = [&](int64_t j, int r) { return id0 + 2 * R * (j - 1) + (j + 1 < steps ? R : 0) + r; };
    next_id_ = id0 + 2 * static_cast<int64_t>(R) * (steps - 2) + R;
    ntasks_ += 2 * static_cast<int64_t>(R) * (steps - 2) + R;
    const int64_t last_recv_step = steps - 2;  // receives exist at steps 1 .. steps-2
    std::vector<double>& first_end = first_end_;
    first_end.resize(static_cast<size_t>(R));
    runs_of_rep_.resize(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) first_end[static_cast<size_t>(r)] = have[static_cast<size_t>(r)].end;
    next_greater_upstream(prev, first_end, ng_, ng_hops_);
    upstream_.built = false;  // (built at the first stretch of rises that asks for it)
    // the receive of step k >= 1 from M_k and M_{k-1}
    auto recv_task = [&](int r, int64_t k, double m_k, double m_before) {
      const double base = static_cast<double>(k - 1) * p2p;
      const double start = m_k + base;
      return task_of(recv_id(k, r), r, start, start + p2p, m_before + base, p2p, SimStream::ring, SimCategory::comm);
    };
    for (int r = 0; r < R; ++r) {
      if (partial_ && !sweep_[static_cast<size_t>(r)]) continue;  // on its line (partial sweep)
      RepAcc& a = acc_[static_cast<size_t>(r)];
      const std::vector<double>& cv = *cost_of[static_cast<size_t>(r)];
      auto& known = runs_of_rep_[static_cast<size_t>(r)];  // (a hash lookup per rank and layer was ~2% of the time)
      if (known.first != &cv) known = {&cv, &cost_runs(&cv, steps)};
      const CostRuns& cost_runs_r = *known.second;
      const std::vector<int64_t>& runs = cost_runs_r.starts;
      const T& h0 = have[static_cast<size_t>(r)];
      // the running maximum M: its value, the one before its last rise, and where it next rises
      // (the receive step k at which a greater first end enters the window; none past the last)
      double m = h0.end, m_before = 0;
      int64_t rise_k = 0;  // the step of M's last rise (0: its start)
      int nx = ng_[static_cast<size_t>(r)];
      int64_t next_rise = nx >= 0 ? ng_hops_[static_cast<size_t>(r)] : std::numeric_limits<int64_t>::max();
      auto advance_m = [&]() {  // M rises at receive step next_rise
        m_before = m;
        m = first_end[static_cast<size_t>(nx)];
        rise_k = next_rise;
        const int n2 = ng_[static_cast<size_t>(nx)];
        next_rise = n2 >= 0 ? next_rise + ng_hops_[static_cast<size_t>(nx)] : std::numeric_limits<int64_t>::max();
        nx = n2;
      };
      // M's rises at hops up to h, all at once: M at hop h is the largest first end of the
      // window, first reached at its first position; the rise before is the largest before that
      auto rise_to = [&](int64_t h) {
        if (next_rise > h) return;
        if (ng_[static_cast<size_t>(nx)] < 0 || next_rise + ng_hops_[static_cast<size_t>(nx)] > h) {  // one rise
          advance_m();
          return;
        }
        if (!upstream_.built) upstream_.build(prev, first_end);
        const int64_t p0 = upstream_.pos0[static_cast<size_t>(r)];
        h = std::min(h, upstream_.len[static_cast<size_t>(r)] - 1);  // (every rise is within a cycle)
        const int64_t top = upstream_.argmax(p0 + next_rise, p0 + h);
        m_before = top == p0 + next_rise ? m : upstream_.value[static_cast<size_t>(upstream_.argmax(p0 + next_rise, top - 1))];
        const int x = upstream_.walk[static_cast<size_t>(top)];
        m = first_end[static_cast<size_t>(x)];
        rise_k = top - p0;
        nx = ng_[static_cast<size_t>(x)];
        next_rise = nx >= 0 ? rise_k + ng_hops_[static_cast<size_t>(x)] : std::numeric_limits<int64_t>::max();
      };
      double c_end = last_compute[static_cast<size_t>(r)].end, c_start = 0;
      double busy = 0, imbalance = a.b.imbalance, exposed = a.b.exposed_comm;
      int64_t comp_top = 1;
      double comp_top_start = 0, first_compute_start = 0;
      // compute j waits for the block received at step j - 1: M_{j-1} + (j - 1) p (the first
      // receive's end for j = 1); its wait for other ranks is what the receive waited, the rise
      // of M at step j - 1
      size_t run = static_cast<size_t>(std::upper_bound(runs.begin(), runs.end(), int64_t{1}) - runs.begin()) - 1;
      constexpr size_t kNotLate = std::numeric_limits<size_t>::max();
      size_t late_run = kNotLate;  // the run whose computes wait for their blocks from here to its end
      for (int64_t ja = 1; ja < steps;) {
        double wait = 0;
        if (ja == 1) {
          wait = std::max(0.0, h0.start - h0.ready);
        } else if (ja - 1 == next_rise && next_rise <= last_recv_step) {
          advance_m();
          wait = std::max(0.0, m - m_before);
        }
        while (run + 1 < runs.size() && runs[run + 1] <= ja) ++run;
        const int64_t run_end = run + 1 < runs.size() ? runs[run + 1] : steps;
        const double c = cost_runs_r.costs[run];
        auto arrival = [&](int64_t j) { return j == 1 ? h0.end : m + static_cast<double>(j - 1) * p2p; };
        if (late_run == run) {
          // late since an earlier segment of this run (c < p): every later block of the run
          // arrives after the compute is free (p apart, computes c < p apart, M only rises), so
          // each compute starts at its block's arrival; over the rest of the run the waits for
          // other ranks telescope to M's rises and the rest is p - c per step
          const double m_start = m_before;  // M before the rise that ended the previous segment
          const int64_t jb = run_end - 1;
          rise_to(std::min(last_recv_step, jb - 1));
          const double steps_n = static_cast<double>(jb - ja + 1);
          busy += steps_n * c;
          imbalance += m - m_start;
          exposed += steps_n * (p2p - c);
          c_start = arrival(jb);
          c_end = c_start + c;
          comp_top = jb, comp_top_start = c_start;
          ja = jb + 1;
          continue;
        }
        if (c >= p2p && ja > 1 && ja > runs[run] && arrival(ja) <= c_end) {
          // c >= p inside a run, at a rise that does not make the block late: compute-bound until
          // a rise that does (its block arrives after the compute before it ends) or the run's end
          int64_t jb;
          for (;;) {
            const int64_t rj = next_rise <= last_recv_step ? next_rise + 1 : steps;
            jb = std::min(run_end, rj) - 1;
            if (jb + 1 >= run_end) break;
            if (first_end[static_cast<size_t>(nx)] + static_cast<double>(rj - 1) * p2p > c_end + static_cast<double>(jb - ja + 1) * c) break;
            // Where M rises at almost every hop (the recompute pass of a long causal ring) the rises
            // after this one are taken at once up to the first that could make its block late: a
            // rise at hop h does when v + h p > c_end + (h + 1 - ja) c (v its first end), i.e. when
            // v - h (c - p) exceeds c_end + (1 - ja) c, and a hop that is not a rise cannot (its v
            // is at most an earlier rise's, which would have, c >= p). A sparse-table search finds
            // the first hop whose value less (c - p) per hop exceeds that, less a slack far above
            // the rounding of either form; every rise before it fails the test above, so taking
            // them at once (rise_to) leaves M as advance_m() one at a time would, and the test
            // above decides at the hop found (or the loop goes on one rise at a time from it).
            constexpr int64_t kRiseSearchMinHops = 16;  // (fewer hops left: one at a time)
            const int64_t h_max = std::min(run_end - 2, last_recv_step);
            if (h_max - next_rise > kRiseSearchMinHops) {
              if (!upstream_.built) upstream_.build(prev, first_end);
              const double d = c - p2p;
              upstream_.tilt(d);
              const int64_t p0 = upstream_.pos0[static_cast<size_t>(r)];
              const int64_t h_end = std::min(h_max, upstream_.len[static_cast<size_t>(r)] - 1);
              const double t = c_end + static_cast<double>(1 - ja) * c - d * static_cast<double>(p0);
              const double slack = 1e-9 * std::max({1.0, std::abs(c_end), std::abs(t), d * static_cast<double>(upstream_.value.size())});
              const int64_t h = next_rise + 1 <= h_end ? upstream_.first_above(p0 + next_rise + 1, p0 + h_end, t - slack) - p0 : h_end + 1;
              ++rise_searches_;
              if (h - 1 >= next_rise) rise_to(h - 1);
              else advance_m();
            } else {
              advance_m();
            }
          }
          const double nn = static_cast<double>(jb - ja + 1);
          const double e = c_end + nn * c;
          busy += nn * c;
          if (c > 0) comp_top = jb, comp_top_start = e - c;
          c_start = e - c;
          c_end = e;
          ja = jb + 1;
          continue;
        }
        const int64_t rise_j = next_rise <= last_recv_step ? next_rise + 1 : steps;  // M changes for compute rise_j
        const int64_t jb = std::min(run_end, rise_j) - 1;  // segment [ja, jb]
        // its first step as the generic loop does it
        late_run = c < p2p && arrival(ja) >= std::max(0.0, c_end) ? run : kNotLate;
        bool late = false;  // the step's compute waited for its block
        {
          const double start = std::max(std::max(0.0, c_end), arrival(ja));
          late = start == arrival(ja);
          const double end = start + c;
          if (ja == 1) first_compute_start = start;
          busy += c;
          const double gap = start - c_end;
          if (gap > 0) {
            const double others = std::min(gap, wait);
            imbalance += others;
            exposed += gap - others;
          }
          if (end > c_end || ja == 1) comp_top = ja, comp_top_start = start;
          c_start = start;
          c_end = end;
        }
        // the rest: no wait for other ranks (M is constant), arrivals p apart
        const int64_t n = jb - ja;
        if (n == 0 && late && c >= p2p && next_rise == ja && ja + 1 < run_end && ja <= last_recv_step &&
            first_end[static_cast<size_t>(nx)] - m > c - p2p) {
          // c >= p, this block late and M rising at the next hop by more than c - p: the next
          // block is late too (it arrives rise + p after this one, the compute is free c after),
          // and so on while M rises by more than c - p at every hop, i.e. while each upstream
          // rank's first end exceeds the one before it by more than c - p (a rise that large is
          // a new maximum). Over that stretch each compute starts at its block's arrival and
          // waits rise - (c - p), all of it for other ranks (the wait is at most the rise).
          if (!upstream_.built) upstream_.build(prev, first_end);
          const double d = c - p2p;
          const int64_t p0 = upstream_.pos0[static_cast<size_t>(r)];
          // the last hop whose block a compute of the run waits for (every rise is within a cycle)
          const int64_t lim = std::min({last_recv_step, run_end - 2, upstream_.len[static_cast<size_t>(r)] - 1});
          const int64_t kk = std::min(lim, upstream_.first_rise_at_most(p0 + ja + 1, p0 + lim, d) - p0 - 1);  // the stretch's last hop
          const int x = upstream_.walk[static_cast<size_t>(p0 + kk)];
          const double m_new = first_end[static_cast<size_t>(x)];
          const double nn = static_cast<double>(kk - ja + 1);  // steps ja + 1 .. kk + 1
          busy += nn * c;
          imbalance += (m_new - m) - nn * d;
          m_before = kk > ja ? upstream_.value[static_cast<size_t>(p0 + kk - 1)] : m;
          m = m_new;
          rise_k = kk;
          nx = ng_[static_cast<size_t>(x)];
          next_rise = nx >= 0 ? kk + ng_hops_[static_cast<size_t>(x)] : std::numeric_limits<int64_t>::max();
          c_start = arrival(kk + 1);
          c_end = c_start + c;
          comp_top = kk + 1, comp_top_start = c_start;
          ja = kk + 2;
          continue;
        }
        if (n > 0) {
          late_run = kNotLate;
          busy += static_cast<double>(n) * c;
          int64_t k = 0;  // steps whose block is there when the compute is free
          if (c >= p2p) {
            if (arrival(ja + 1) - c_end <= 0) k = n;
          } else {
            const double d1 = arrival(ja + 1) - c_end;
            if (d1 <= 0) {
              const double kk = std::floor(-d1 / (p2p - c)) + 1;
              k = kk >= static_cast<double>(n) ? n : static_cast<int64_t>(kk);
            }
            while (k > 0 && arrival(ja + k) - (c_end + static_cast<double>(k - 1) * c) > 0) --k;  // rounding at the edge
            while (k < n && arrival(ja + k + 1) - (c_end + static_cast<double>(k) * c) <= 0) ++k;
          }
          if (k == n) {
            const double e = c_end + static_cast<double>(n) * c;
            if (c > 0 || e > c_end) comp_top = jb, comp_top_start = e - c;
            c_start = e - c;
            c_end = e;
          } else {
            // steps ja+1 .. ja+k compute-bound, then step ja+k+1 waits gap1; with c < p every
            // later one waits p - c, with c >= p (k = 0) none does
            const double e_k = c_end + static_cast<double>(k) * c;
            const double gap1 = arrival(ja + k + 1) - e_k;
            exposed += gap1;
            double e;
            if (c < p2p) {
              late_run = run;
              exposed += static_cast<double>(n - k - 1) * (p2p - c);
              e = arrival(jb) + c;
              comp_top = jb, comp_top_start = arrival(jb);
            } else {
              e = arrival(ja + 1) + static_cast<double>(n) * c;
              if (c > 0) comp_top = jb, comp_top_start = e - c;
              else comp_top = ja + 1, comp_top_start = arrival(ja + 1);
            }
            c_start = e - c;
            c_end = e;
          }
        }
        ja = jb + 1;
      }
      // M at the last receive and the one before, the receive ending last (p > 0: the last one;
      // p = 0: where M last rose, or the first)
      rise_to(last_recv_step);
      const double m_last = m;
      const double m_last_before = rise_k == last_recv_step ? m_before : m;
      int64_t recv_top = last_recv_step;
      double recv_top_m = m_last, recv_top_m_before = m_last_before;
      if (p2p <= 0) {
        recv_top = std::max<int64_t>(1, rise_k);
        recv_top_m = m;
        recv_top_m_before = rise_k >= 1 ? m_before : m;
      }
      // what finish() accumulated task by task
      a.busy += busy;
      a.stream_busy += busy;
      a.b.compute += busy;
      a.b.imbalance = imbalance;
      a.b.exposed_comm = exposed;
      a.prev_end = c_end;
      const int64_t lj = steps - 1;
      const T last_c = task_of(comp_id(lj, r), r, c_start, c_end, c_start, cost_runs_r.costs.back(), SimStream::compute, SimCategory::compute);
      last_compute[static_cast<size_t>(r)] = last_c;
      last_[static_cast<size_t>(r) * kSimStreams + static_cast<int>(SimStream::compute)] = last_c;
      // the task ending last, the rank's end and forward span
      T best = task_of(comp_id(comp_top, r), r, comp_top_start, c_end, comp_top_start, cost_runs_r.at(comp_top), SimStream::compute,
                       SimCategory::compute);
      double first_start = first_compute_start;
      if (last_recv_step >= 1) {
        const T lr = recv_task(r, last_recv_step, m_last, m_last_before);
        last_[static_cast<size_t>(r) * kSimStreams + static_cast<int>(SimStream::ring)] = lr;
        const T top = recv_task(r, recv_top, recv_top_m, recv_top_m_before);
        // a receive is created before the compute of its step
        if (top.end > best.end || (top.end == best.end && recv_top <= comp_top)) best = top;
        first_start = std::min(first_start, recv_task(r, 1, std::max(h0.end, first_end[static_cast<size_t>(prev[static_cast<size_t>(r)])]), h0.end).start);
      }
      a.end = std::max(a.end, best.end);
      if (a.last.id < 0 || best.end > a.last.end) a.last = best;
      if (pass == SimPass::forward) {
        if (a.fwd_start < 0 || first_start < a.fwd_start) a.fwd_start = first_start;
        a.fwd_end = std::max(a.fwd_end, best.end);
      }
    }
  }

  // ---- periodicity over layers (without a recording) ---------------------------------------------
  // The state between two iterations of a layer loop: every (rank, stream)'s last task, the tasks
  // the loop carries to its next iteration, the per-rank accumulators, the forward span of the
  // micro-batch and the counters. Every time in it is a max-plus expression of the times before
  // the iteration (a task starts at the latest end of its dependencies): a convex, piecewise-linear
  // map F. When two alike iterations in a row have moved every component by the same amount
  // delta (its own amount: 0 for a stream the loop leaves alone, lambda for the critical rank,
  // less for a rank that is still catching up), the state moves on the line S(t) = S + t delta with
  // F(S(t)) = S(t + 1) at t = -1 and t = 0. If one swept iteration from S(m) also lands on
  // S(m + 1), then F(S(t)) - S(t + 1), convex in t and zero at -1, 0 and m, is zero on all of
  // [0, m]: the m iterations in between are the line, and are not swept. So the jump sweeps one
  // iteration to check its far end (halving the distance until the check holds, or giving up),
  // and is exact up to rounding: increments are compared to 1e-12 of the values they move (the
  // sweep's own rounding differs by a few hundred ulps from iteration to iteration), and
  // S + m delta rounds differently from m sums. The accumulators (busy, breakdown) are not
  // max-plus (an idle gap is split by a min); the check at the far end covers them.
  struct Snapshot {
    std::vector<T> tasks;          // last_, then the carried vectors in order
    std::vector<RepAcc> acc;
    int64_t next_id = 0;
    int64_t next_coll = 0;
    int64_t ntasks = 0;
  };
  void take(Snapshot& s, std::initializer_list<std::vector<T>*> carried) const {
    s.tasks.assign(last_.begin(), last_.end());
    for (const std::vector<T>* v : carried) s.tasks.insert(s.tasks.end(), v->begin(), v->end());
    s.acc = acc_;
    s.next_id = next_id_;
    s.next_coll = next_coll_;
    s.ntasks = ntasks_;
  }

  // The live state from a snapshot take() made (the inverse of take()).
  void restore(const Snapshot& s, std::initializer_list<std::vector<T>*> carried) {
    std::copy(s.tasks.begin(), s.tasks.begin() + static_cast<std::ptrdiff_t>(last_.size()), last_.begin());
    size_t i = last_.size();
    for (std::vector<T>* v : carried) {
      std::copy(s.tasks.begin() + static_cast<std::ptrdiff_t>(i), s.tasks.begin() + static_cast<std::ptrdiff_t>(i + v->size()), v->begin());
      i += v->size();
    }
    acc_ = s.acc;
    next_id_ = s.next_id;
    next_coll_ = s.next_coll;
    ntasks_ = s.ntasks;
  }

  // ---- where a line ends: the margins of the sweep's maxima ----------------------------------------
  // A task starts at the latest end of its dependencies (its stream's previous task first), and a
  // collective's members at the latest readiness among them: on a line, every such maximum picks
  // the same argument iteration after iteration, and the line ends at the first iteration where
  // one picks another (or where a maximum the tape does not see does: the backward ring's closed
  // form, the forward ring's running maxima, the accumulators' min and max). The tape holds, in
  // creation order, per task with two or more distinct dependencies how far the runner-up's end is
  // below the latest (a third one overtaking the first unseen), and per member of a joining
  // collective how far its readiness is below the last member's. Two swept
  // iterations on a line give each margin's change per iteration; a margin that closes, m_t = m -
  // r t, goes below 0 after t = m / r: its maximum picks another argument there. The least such t
  // over the tape is where the line can end first, a guess Period::jump checks like any other
  // distance (a probe that fails there leaves the usual search below it); exact where the first
  // flip is one the tape sees. (The 1024-GPU space's banded rings with full recompute, cp=256 tp=4
  // and cp=512 tp=2: in all 8 jumps looked at, the guess was the farthest distance that held.)
  struct Margins {
    std::vector<double> m[2];  // [1]: the last swept iteration's, [0]: the one before (n[i] values each)
    size_t n[2] = {0, 0};
    bool on = false;           // taping
    int swept = 0;             // iterations swept and taped in a row (each one's state observed)
    bool missed = false;       // a guess failed in this layer loop: the search alone for the rest of it
    int off_line = 0;          // observations off their line in a row
    // A loop whose state stays off its line for long (the 1,024-rank plain ring's backward without
    // recompute never finds one) tapes no more until it finds one: ~4% of such a sweep.
    static constexpr int kPatience = 16;
    void reset() { swept = 0, missed = false, off_line = 0; }
    // before a swept iteration: tape it where it may be used
    void start(bool wanted) {
      if (!wanted || off_line >= kPatience) return;
      std::swap(m[0], m[1]), std::swap(n[0], n[1]);
      n[1] = 0, on = true;
    }
    void stop() {
      swept = on ? swept + 1 : 0;
      on = false;
    }
    void observed(bool on_line) { off_line = on_line ? 0 : off_line + 1; }
    [[gnu::always_inline]] void put(double v) {
      if (n[1] == m[1].size()) m[1].resize(2 * m[1].size() + 1024);
      m[1][n[1]++] = v;
    }
    // After two swept iterations on a line: how many more iterations the taped maxima keep their
    // arguments for (infinity: none closes); -1: not known (fewer than two tapes, or unlike ones)
    double iterations_left() const {
      if (missed || swept < 2 || n[0] != n[1]) return -1;
      double scale = 0;
      for (size_t k = 0; k < n[1]; ++k) scale = std::max(scale, std::abs(m[1][k]));
      double left = std::numeric_limits<double>::infinity();
      for (size_t k = 0; k < n[1]; ++k) {
        const double a = m[0][k], b = m[1][k];
        const double closing = a - b;  // per iteration
        // (a margin that moves by rounding only, ~1e-16 of the times, is constant)
        if (closing > 1e-12 * std::max(scale, 1.0)) left = std::min(left, b / closing);
      }
      return left;
    }
  };

  class Period {
   public:
    explicit Period(bool micro_batches = false) : micro_batches_(micro_batches) {}
    // Forgets what was observed (for the next loop); the snapshots keep their memory.
    void reset() {
      seen_ = 0;
      fail_at_ = kNever;
      probe_ = 2;
    }
    // The ranks still catching up from state y to z: those whose time `f` (a time that never
    // decreases) moved by less than the fastest-moving rank's, to 1e-9 of it. Marks them in `mark`
    // (if given) and returns how many.
    static int64_t catching_up(const Snapshot& y, const Snapshot& z, double RepAcc::*f, char* mark = nullptr) {
      double lambda = 0;
      for (size_t r = 0; r < z.acc.size(); ++r) lambda = std::max(lambda, z.acc[r].*f - y.acc[r].*f);
      int64_t n = 0;
      for (size_t r = 0; r < z.acc.size(); ++r)
        if (z.acc[r].*f - y.acc[r].*f < lambda * (1 - 1e-9)) {
          ++n;
          if (mark) mark[r] = 1;
        }
      return n;
    }
    // Whether every rank's compute stream moved by the same amount in the last observed step: no
    // rank still catching up with the others. (Not the ranks' last ends: under ZeRO the gradient
    // reduction, a collective, ends last on every rank alike.)
    bool one_pace() const { return catching_up(s_[1], s_[2], &RepAcc::prev_end) == 0; }
    // Records the state after an iteration; true when the last three states lie on a line.
    bool observe(const Builder& b, std::initializer_list<std::vector<T>*> carried) {
      std::swap(s_[0], s_[1]);
      std::swap(s_[1], s_[2]);
      b.take(s_[2], carried);
      seen_ = std::min(seen_ + 1, 3);
      const bool on_line = seen_ == 3 && same_step(s_[0], s_[1], s_[1], s_[2]);
      if (!on_line) fail_at_ = kNever;  // a new line
      else if (fail_at_ != kNever) --fail_at_;  // the same line, from one iteration farther
      return on_line;
    }
    // After observe() returned true: advances the loop by up to n iterations, `iterate(m)`
    // sweeping the m-th iteration after the observed one. Returns how many iterations were
    // done (0: none; the state is the observed one again).
    //
    // Each probe places the state at S(m - 1) on the line and sweeps one iteration to check the far
    // end (see the comment above Snapshot): a check that holds proves the whole stretch [0, m], and
    // proves it on the same line, so probes go on from the observed state: doubling while they
    // hold, then between the farthest that held (`lo`) and the nearest that failed (`hi`). A
    // failed check measures how far its sweep left the line (`off`); two failed probes give a
    // secant guess of where it left, tried first (exact when one max flipped in between), else the
    // midpoint. The search stops when no distance of at least 2 is left untried below `hi`; the
    // state is then the farthest checked one (a miss costs one swept iteration, as a success).
    // No probe goes where it must fail: off is convex in the distance (the times are maxes of
    // lines) and 0 at the observed state, so past a failed distance every distance fails, and past
    // the secant's zero too; a failed distance is remembered while the next observations stay on
    // its line (fail_at_). These only spare sweeps: every jump is still checked at its far end.
    // `flip_after` (Margins::iterations_left, -1: not known): the distance past which a taped
    // maximum picks another argument; the farthest distance within it is checked first, and
    // under 2 none.
    int64_t jump(Builder& b, std::initializer_list<std::vector<T>*> carried, int64_t n, const std::function<void(int64_t)>& iterate,
                 double flip_after = -1) {
      // a check of this line already failed at distance fail_at_ (from the observed state): every
      // farther one fails too (off is convex in the distance and was 0 at the observed state)
      int64_t cap = std::min(n, fail_at_ - 1);  // the farthest distance left possible
      if (cap < 2) return 0;
      const bool flips = flip_after >= 0 && flip_after < static_cast<double>(cap);  // within reach
      if (flip_after >= 0 && flip_after < 2) return 0;  // (a jump of 1 is the sweep it would check)
      int64_t lo = 0, hi = n + 1;  // the line holds up to lo; it fails at hi (n + 1: not seen)
      double off_hi = 0, off_mid = 0;
      int64_t mid_fail = -1;       // a second failed distance below hi (for the secant)
      // a probe at distance m: true where the check holds (then the farthest checked state)
      auto probe = [&](int64_t m, double& off) {
        place(b, carried, m - 1);
        b.take(p_, carried);
        b.as(SimLayerRun::probe, [&] { iterate(m); });
        b.take(w_, carried);
        if (same_step(s_[1], s_[2], p_, w_, &off)) {
          std::swap(good_p_, p_);
          std::swap(good_w_, w_);
          return true;
        }
        ++b.jump_misses_;
        return false;
      };
      int64_t m = std::min(cap, probe_), far_fail = kNever;
      // Where every rank keeps one pace (none still catching up: the ranks whose lines end one
      // after another), the line holds to the loop's end: the farthest distance is checked first,
      // one sweep where doubling from 2 took up to seven (the 1024-GPU space's rings with full
      // recompute: both passes' first line, 75 layers, ~1 ms a sweep at 1,024 ranks). It held in
      // all 52,990 such jumps of the space (bench_simulator --space); where it does not, the
      // search below goes on as before, below that distance.
      if (cap > m && one_pace() && !flips) {
        double off = 0;
        if (probe(cap, off)) {
          lo = cap, m = cap + 1;  // (no more probes)
        } else {
          ++b.far_first_misses_;
          far_fail = cap;
          cap -= 1;
        }
      } else if (flips) {
        // the farthest distance before a taped maximum picks another argument; where its check
        // holds the next one is not tried (it would leave the line)
        const int64_t guess = static_cast<int64_t>(std::floor(flip_after));
        double off = 0;
        ++b.kinks_predicted_;
        if (probe(guess, off)) {
          lo = guess, m = guess + 1;  // (no more probes)
        } else {
          hi = guess, off_hi = off;
          b.margins_.missed = true, ++b.kink_misses_;  // (a maximum the tape does not see ended it: not again in this loop)
          cap = guess - 1;
          m = std::min(cap, probe_);
        }
      }
      while (m >= lo + 2 && m < hi && m <= cap) {
        double off = 0;
        if (probe(m, off)) {
          lo = m;
        } else {
          if (hi <= n) mid_fail = hi, off_mid = off_hi;
          hi = m, off_hi = off;
          if (mid_fail > hi && off_mid > off_hi && off_hi > 0) {
            // off grows linearly past where the line was left (one max flipped): the secant of
            // the two failed probes meets 0 there; the farthest distance whose sweep starts before
            // it is the guess. Where off is convex in the distance (the max-plus times are: a
            // max of lines), the secant meets 0 no earlier than where the line was left, so no
            // farther distance can hold: the guess caps the search.
            const double left = static_cast<double>(hi - 1) - off_hi * static_cast<double>(mid_fail - hi) / (off_mid - off_hi);
            const double guess = std::floor(left) + 1;
            if (guess < static_cast<double>(lo + 2)) break;
            if (guess < static_cast<double>(hi)) {
              m = static_cast<int64_t>(guess);
              cap = m;
              continue;
            }
          }
        }
        if (hi > n) {
          if (m >= cap) break;
          m = std::min(cap, 2 * m);  // doubling while every check held
        } else {
          m = std::min(cap, lo + (hi - lo + 1) / 2);
        }
      }
      const int64_t failed = hi <= n && std::isfinite(off_hi) ? hi : far_fail;  // the nearest distance known to fail
      if (lo == 0) {
        place(b, carried, 0);  // the observed state again
        probe_ = std::max<int64_t>(2, std::min(n, probe_) / 2);
        fail_at_ = failed;
        return 0;
      }
      b.restore(good_w_, carried);
      ++b.jumps_;
      (micro_batches_ ? b.micro_batches_skipped_ : b.layers_skipped_) += lo - 1;
      std::swap(s_[1], good_p_);  // the line goes on from here
      std::swap(s_[2], good_w_);
      seen_ = 2;
      fail_at_ = failed != kNever ? failed - lo : kNever;
      probe_ = hi > n ? 2 * lo : std::max<int64_t>(4, lo);
      return lo;
    }

   private:
    static constexpr double kTol = 1e-12;
    // the live state = the last observed state + m times the last step
    // (`skip`, given: leaves the ranks it marks as they are; partial_jump)
   public:
    void place(Builder& b, std::initializer_list<std::vector<T>*> carried, int64_t m, const char* skip = nullptr) const {
      const Snapshot &y = s_[1], &z = s_[2];
      const double dm = static_cast<double>(m);
      auto lin = [&](double y0, double z0) { return y0 == z0 ? z0 : z0 + dm * (z0 - y0); };
      auto task = [&](const T& y0, const T& z0) {
        if (y0.id == z0.id) return z0;
        T t = z0;
        t.id = z0.id + m * (z0.id - y0.id);
        t.start = lin(y0.start, z0.start);
        t.end = lin(y0.end, z0.end);
        t.ready = lin(y0.ready, z0.ready);
        return t;
      };
      if (skip) {
        const size_t R = b.acc_.size();
        for (size_t r = 0; r < R; ++r) {
          if (skip[r]) continue;
          for (size_t i = r * kSimStreams; i < (r + 1) * kSimStreams; ++i) b.last_[i] = task(y.tasks[i], z.tasks[i]);
          size_t i = b.last_.size() + r;
          for (std::vector<T>* v : carried) {
            (*v)[r] = task(y.tasks[i], z.tasks[i]);
            i += R;
          }
        }
      } else {
        size_t i = 0;
        for (T& t : b.last_) { t = task(y.tasks[i], z.tasks[i]); ++i; }
        for (std::vector<T>* v : carried)
          for (T& t : *v) { t = task(y.tasks[i], z.tasks[i]); ++i; }
      }
      for (size_t r = 0; r < b.acc_.size(); ++r) {
        if (skip && skip[r]) continue;
        const RepAcc &ya = y.acc[r], &za = z.acc[r];
        RepAcc& a = b.acc_[r];
        for (double RepAcc::*f : kRepAccNumbers) a.*f = lin(ya.*f, za.*f);
        for (double StepBreakdown::*f : kBreakdownNumbers) a.b.*f = lin(ya.b.*f, za.b.*f);
        a.last = task(ya.last, za.last);
      }
      b.next_id_ = z.next_id + m * (z.next_id - y.next_id);
      b.next_coll_ = z.next_coll + m * (z.next_coll - y.next_coll);
      b.ntasks_ = z.ntasks + m * (z.ntasks - y.ntasks);
    }
    // Does b0 -> b1 move every component as a0 -> a1 does?
    // `off` (if given and the steps differ): the largest difference between two steps, in seconds.
    static bool same_step(const Snapshot& a0, const Snapshot& a1, const Snapshot& b0, const Snapshot& b1, double* off = nullptr) {
      const double d = step_difference(a0, a1, b0, b1, off == nullptr);
      if (off) *off = d;
      return d == 0;
    }
    // The largest difference between the steps a0 -> a1 and b0 -> b1 of any component, 0 where
    // within the tolerance (infinite where they differ in kind: ids, durations, counters, or a
    // NaN); `first` stops at the first difference.
    // `ranks` (given): only those ranks' components (and the counters), infinite at the first
    // difference; `off` (given): marks every rank with a component off the step.
   public:
    static double step_difference(const Snapshot& a0, const Snapshot& a1, const Snapshot& b0, const Snapshot& b1, bool first,
                                  const char* ranks = nullptr, char* off = nullptr) {
      constexpr double kInf = std::numeric_limits<double>::infinity();
      if (a0.tasks.size() != b1.tasks.size() || a1.tasks.size() != b1.tasks.size() || b0.tasks.size() != b1.tasks.size()) return kInf;
      if (a1.next_id - a0.next_id != b1.next_id - b0.next_id || a1.next_coll - a0.next_coll != b1.next_coll - b0.next_coll ||
          a1.ntasks - a0.ntasks != b1.ntasks - b0.ntasks)
        return kInf;
      double worst = 0;
      auto step = [&](double p, double q, double r, double s) __attribute__((always_inline)) {  // (inlined: called per number)
        double d = 0;
        if (p == q) {  // unchanged (also infinities)
          if (r != s) d = std::isfinite(r) && std::isfinite(s) ? std::abs(s - r) : kInf;
        } else {
          d = std::abs((s - r) - (q - p));
          if (d <= kTol * std::max(std::abs(s), std::abs(q))) d = 0;
          else if (std::isnan(d)) d = kInf;
        }
        worst = std::max(worst, d);
        return d == 0;
      };
      auto task = [&](const T& p, const T& q, const T& r, const T& s) __attribute__((always_inline)) {
        if (p.id == q.id) {  // untouched (or no task) in both
          if (!(r.id == s.id && (p.id < 0) == (r.id < 0))) worst = kInf;
          return worst == 0;
        }
        if (p.id < 0 || r.id < 0 || q.id - p.id != s.id - r.id || p.rep != s.rep || q.rep != s.rep || r.rep != s.rep ||
            p.stream != s.stream || q.stream != s.stream || r.stream != s.stream || p.category != s.category ||
            q.category != s.category || r.category != s.category || p.duration != s.duration || q.duration != s.duration ||
            r.duration != s.duration) {
          worst = kInf;
          return false;
        }
        const bool a = step(p.start, q.start, r.start, s.start);
        const bool b = step(p.end, q.end, r.end, s.end);
        const bool c = step(p.ready, q.ready, r.ready, s.ready);
        return a && b && c;
      };
      if (ranks) {  // only the components of the ranks `ranks` includes (partial_jump)
        const size_t R = b1.acc.size(), own = R * kSimStreams;
        for (size_t i = 0; i < b1.tasks.size(); ++i)
          if (ranks[i < own ? i / kSimStreams : (i - own) % R] && !task(a0.tasks[i], a1.tasks[i], b0.tasks[i], b1.tasks[i])) return kInf;
        for (size_t r = 0; r < R; ++r) {
          if (!ranks[r]) continue;
          const RepAcc &p = a0.acc[r], &q = a1.acc[r], &u = b0.acc[r], &v = b1.acc[r];
          if (!task(p.last, q.last, u.last, v.last)) return kInf;
          for (double RepAcc::*f : kRepAccNumbers)
            if (!step(p.*f, q.*f, u.*f, v.*f)) return worst;
          for (double StepBreakdown::*f : kBreakdownNumbers)
            if (!step(p.b.*f, q.b.*f, u.b.*f, v.b.*f)) return worst;
        }
        return worst;
      }
      if (off) {  // every rank with a component off the step: off[r] = 1 (partial_jump)
        const size_t R = b1.acc.size(), own = R * kSimStreams;
        for (size_t i = 0; i < b1.tasks.size(); ++i) {
          const double before = worst;
          worst = 0;
          if (!task(a0.tasks[i], a1.tasks[i], b0.tasks[i], b1.tasks[i])) off[i < own ? i / kSimStreams : (i - own) % R] = 1;
          worst = std::max(worst, before);
        }
        for (size_t r = 0; r < R; ++r) {
          const RepAcc &p = a0.acc[r], &q = a1.acc[r], &u = b0.acc[r], &v = b1.acc[r];
          const double before = worst;
          worst = 0;
          bool same = task(p.last, q.last, u.last, v.last);
          for (double RepAcc::*f : kRepAccNumbers) same = step(p.*f, q.*f, u.*f, v.*f) && same;
          for (double StepBreakdown::*f : kBreakdownNumbers) same = step(p.b.*f, q.b.*f, u.b.*f, v.b.*f) && same;
          if (!same) off[r] = 1;
          worst = std::max(worst, before);
        }
        return worst;
      }
      if (first) {  // (a subset of the checks below, first: where the whole state is off its line,
                    // the ranks still catching up at the top of a ring leave it; checked from there)
        for (size_t r = b1.acc.size(); r-- > 0;)
          if (!step(a0.acc[r].prev_end, a1.acc[r].prev_end, b0.acc[r].prev_end, b1.acc[r].prev_end)) return worst;
      }
      for (size_t i = 0; i < b1.tasks.size(); ++i)
        if (!task(a0.tasks[i], a1.tasks[i], b0.tasks[i], b1.tasks[i]) && (first || worst == kInf)) return worst;
      for (size_t r = 0; r < b1.acc.size(); ++r) {
        const RepAcc &p = a0.acc[r], &q = a1.acc[r], &u = b0.acc[r], &v = b1.acc[r];
        if (!task(p.last, q.last, u.last, v.last) && (first || worst == kInf)) return worst;
        for (double RepAcc::*f : kRepAccNumbers)
          if (!step(p.*f, q.*f, u.*f, v.*f) && first) return worst;
        for (double StepBreakdown::*f : kBreakdownNumbers)
          if (!step(p.b.*f, q.b.*f, u.b.*f, v.b.*f) && first) return worst;
      }
      return worst;
    }
    // the last three observed states (s(2) the latest) and how many of them are valid (partial_jump)
    const Snapshot& s(int i) const { return s_[i]; }
    int seen() const { return seen_; }

   private:
    Snapshot s_[3], p_, w_, good_p_, good_w_;
    bool micro_batches_ = false;  // what an iteration is (for the statistics): a micro-batch, else a layer
    int seen_ = 0;
    int64_t probe_ = 2;
    // where a check of the current line failed, in iterations from the last observed state (a
    // failed check is remembered while later observations stay on its line)
    static constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
    int64_t fail_at_ = kNever;
  };

  // ---- the partial sweep (forward layer loop of a plain ring) -----------------------------------
  // Where the whole state leaves its line (Period), most ranks of a large ring still move on
  // theirs: summed over a pass only a few layers' worth of ranks leave it. partial_jump then moves
  // the ranks on their lines (A) and sweeps only the others (B), layer after layer.
  //
  // Why it is exact. Within one forward layer of a plain ring (one pack class, no Ulysses) a rank
  // reads another rank's times at three places only: (1) its first receive waits for its ring
  // neighbour's pre-attention compute (the block it sends); (2) its later receives wait for the
  // running maximum M_k of the first receives' ends over it and its k upstream neighbours
  // (ring_forward_by_rank); (3) the ZeRO-3 parameter gather starts when its last member is ready
  // (one arrival over all ranks). Everything else is the rank's own streams. Let D(t) say that at
  // layer t no B value reaches an A rank: (1) a B neighbour's compute ends strictly before the A
  // rank's first receive starts, (2) every B rank's first receive ends strictly before that of the
  // first A rank downstream of it (walking upstream from any A rank, that A rank comes first and
  // is larger: the B rank is never a new maximum of its M_k), (3) every B member of the gather is
  // ready strictly before the gather's arrival (decided by A members). All three are strict by a
  // margin (kPartialMargin of the value) far above the line's rounding.
  // Where D(t) holds, the A ranks' next state is F_A(A's state), F_A the layer's max-plus map with
  // every B input dropped: convex and piecewise linear in A's state, as F is in the whole state
  // (the comment above Snapshot). Period's three observed states (two sweeps, each with D checked
  // on its tape) put A's state on a line S_A(t) with F_A(S_A(t)) = S_A(t + 1) at t = -2, -1; one
  // full sweep from S(v) (B as swept, A placed on its line) that lands A on S_A(v + 1), with D(v),
  // makes F_A(S_A(t)) - S_A(t + 1), convex in t and zero at -2, -1 and v, zero on [-1, v]. The
  // values A ranks lend to B ((1)-(3): their pre-attention end, first receive's start and end, the
  // gather's arrival) are max-plus functions of A's state too, so each is convex in t; recorded on
  // a line at t = -2, -1 (the tapes) and checked on it at v by the same sweep, each is that line on
  // [-1, v]. By induction over the layers 0 .. v-1 (and within a layer over its tasks in creation
  // order): A on its line and B as swept are the true state, B reads A's true values, and D(t)
  // (checked each layer on B's swept values against A's lines) keeps A on F_A's trajectory. So
  // the state after the verifying sweep is the swept one, up to the rounding Period accepts (the
  // accumulators, which split gaps by a min, are checked at the far end as Period checks them).
  // A failed D at layer t ends the stretch at v = t - 1; a failed far-end check undoes the jump.
  //
  // The backward layer loop has no partial sweep. One was built on the design below (f7f127e, with
  // ring_backward_band and its tests; exact: all 27,935 plans of the 1024-GPU space bit for bit, 240
  // random rings against the event queue) and removed again (session 16) because it was slower on the
  // rings it was for (cp=256/512 1.05-1.21x, cp=1024 0.97-1.06x, thread CPU): the ranks still catching
  // up form a band at the top of the ring whose front moves one rank downstream every few layers (at
  // cp=512 the ranks off the common line per layer go 511, 284, 197, 150, 120, 100, 86 ... 13 over
  // layers 1..30: about R / layer), so D fired within 1-3 layers unless the band took ranks ahead of
  // it, and far ends failed after 4-30 layers. A backward layer of a plain ring reads other ranks'
  // times at (a) the ZeRO-3 gather and (b) the gradient reduction (collectives joining every rank),
  // (c) the recompute pass's forward ring ((1), (2) above), (d) the backward ring's first step and
  // (e) every later step j: the upstream's receive of step j - 1, its compute of step j and its hop
  // of step j - 1 (ring_backward.hpp's recurrences). The forward's strict D never holds there (the
  // K,V chain passes through B); the sound weaker D that was built: each read of a B value b(t) by
  // an A rank holds b(t) on the line l(t) two observed layers give it, or has b(t) and l(t) both
  // strictly below the A side; then A's next state is F(S_A(t), l(t)), a max-plus map of lines.
  struct Tape {  // what one forward iteration's ranks lend each other ((1)-(3) above), per rank
    std::vector<double> pre_end, recv_start, recv_end, gather_ready;
    double gather_arrival = 0;
    int gathers = 0;       // joining collectives seen (the argument covers one ZeRO-3 gather)
    bool ring = false;     // the first step's receives seen
    bool unsupported = false;
    void clear(size_t n) {
      pre_end.assign(n, 0.0), recv_start.assign(n, 0.0), recv_end.assign(n, 0.0), gather_ready.assign(n, 0.0);
      gather_arrival = 0, gathers = 0, ring = false, unsupported = false;
    }
  };
  static constexpr double kPartialMargin = 1e-9;  // D's strictness, relative (the line's rounding is ~1e-14)
  static bool below(double b, double a) { return b < a - kPartialMargin * std::abs(a); }
  int ring_prev(int r) const { return (r + nreps() - 1) % nreps(); }
  // the ranks the partial sweep handles: one plain ring of unequal ranks, without a recording
  bool partial_possible() const {
    return nreps() >= partial_min_ranks_ && !record_ && k_.cp_kind == CpKind::ring && k_.ulysses == 1 && k_.attn_fwd.size() == 1 && cp_reps_ == k_.cp &&
           k_.cp >= 4 && k_.ring >= 3 && nreps() == static_cast<int>(k_.cp);
  }
  double tape_line(std::vector<double> Tape::*f, int r) const {
    const double y = (tape_[0].*f)[static_cast<size_t>(r)], z = (tape_[1].*f)[static_cast<size_t>(r)];
    return y == z ? z : z + partial_dm_ * (z - y);
  }
  // attention's first ring step, before its receives: tape the pre-attention ends; partial: A's
  // from their lines, and D (1)
  void first_step_in(std::vector<T>& have) {
    const int R = nreps();
    if (taping_)
      for (int r = 0; r < R; ++r) tape_out_->pre_end[static_cast<size_t>(r)] = have[static_cast<size_t>(r)].end;
    if (!partial_) return;
    for (int r = 0; r < R; ++r)
      if (!sweep_[static_cast<size_t>(r)]) have[static_cast<size_t>(r)].end = tape_line(&Tape::pre_end, r);
    for (int r = 0; r < R; ++r)
      if (!sweep_[static_cast<size_t>(r)] && sweep_[static_cast<size_t>(ring_prev(r))] &&
          !below(have[static_cast<size_t>(ring_prev(r))].end, tape_line(&Tape::recv_start, r)))
        d_failed_ = true;
  }
  // after them: tape the receives; partial: A's from their lines, and D (2)
  void first_step_out(std::vector<T>& recv, bool has_recv) {
    const int R = nreps();
    if (!has_recv) {
      if (taping_) tape_out_->unsupported = true;
      if (partial_) d_failed_ = true;
      return;
    }
    if (taping_) {
      tape_out_->ring = true;
      for (int r = 0; r < R; ++r) {
        tape_out_->recv_start[static_cast<size_t>(r)] = recv[static_cast<size_t>(r)].start;
        tape_out_->recv_end[static_cast<size_t>(r)] = recv[static_cast<size_t>(r)].end;
      }
    }
    if (!partial_) return;
    for (int r = 0; r < R; ++r)
      if (!sweep_[static_cast<size_t>(r)]) {
        recv[static_cast<size_t>(r)].start = tape_line(&Tape::recv_start, r);
        recv[static_cast<size_t>(r)].end = tape_line(&Tape::recv_end, r);
      }
    for (int r = 0; r < R; ++r)
      if (sweep_[static_cast<size_t>(r)] && !below(recv[static_cast<size_t>(r)].end, recv[static_cast<size_t>(down_[static_cast<size_t>(r)])].end))
        d_failed_ = true;
  }
  // a collective joining ranks (not G::self): tape the ZeRO-3 gather; partial: its arrival from
  // the line, and D (3) (`arrival[0]` holds the B members' latest readiness)
  void joined(G g, const std::vector<T>& ids, std::vector<double>& arrival) {
    if (g != G::zero) {
      if (taping_) tape_out_->unsupported = true;
      if (partial_) d_failed_ = true;
      return;
    }
    if (taping_) {
      ++tape_out_->gathers;
      for (int r = 0; r < nreps(); ++r) tape_out_->gather_ready[static_cast<size_t>(r)] = ids[static_cast<size_t>(r)].start;
      tape_out_->gather_arrival = arrival[0];
    }
    if (!partial_) return;
    if (++partial_gathers_ > 1) {
      d_failed_ = true;
      return;
    }
    const double y = tape_[0].gather_arrival, z = tape_[1].gather_arrival;
    const double a = y == z ? z : z + partial_dm_ * (z - y);
    if (!below(arrival[0], a)) d_failed_ = true;
    arrival[0] = a;
  }
  // down_[b]: the first A rank downstream of b (it receives b's blocks first), -1: none
  void find_down() {
    const int R = nreps();
    down_.assign(static_cast<size_t>(R), -1);
    int next_a = -1;
    for (int i = 2 * R - 1; i >= 0; --i) {
      const int r = i % R;
      if (!sweep_[static_cast<size_t>(r)]) next_a = r;
      else down_[static_cast<size_t>(r)] = next_a;
    }
  }
  // D (1)-(3) on a recorded iteration for the ranks sweep_ marks: 1 holds; 0 fails; -1 grown
  // (with `grow`, the A ranks that a B value reaches through (1) or (2) join B: call again)
  int d_check(const Tape& x, bool grow) {
    if (x.unsupported || !x.ring || x.gathers > 1) return 0;
    const int R = nreps();
    bool grew = false;
    if (x.gathers == 1)
      for (int b = 0; b < R; ++b)
        if (sweep_[static_cast<size_t>(b)] && !below(x.gather_ready[static_cast<size_t>(b)], x.gather_arrival)) return 0;
    for (int a = 0; a < R; ++a) {
      const int b = ring_prev(a);
      if (!sweep_[static_cast<size_t>(a)] && sweep_[static_cast<size_t>(b)] &&
          !below(x.pre_end[static_cast<size_t>(b)], x.recv_start[static_cast<size_t>(a)])) {
        if (!grow) return 0;
        sweep_[static_cast<size_t>(a)] = 1, grew = true;
      }
    }
    find_down();
    for (int b = 0; b < R; ++b) {
      if (!sweep_[static_cast<size_t>(b)]) continue;
      const int a = down_[static_cast<size_t>(b)];
      if (a < 0) return 0;
      if (!below(x.recv_end[static_cast<size_t>(b)], x.recv_end[static_cast<size_t>(a)])) {
        if (!grow) return 0;
        sweep_[static_cast<size_t>(a)] = 1, grew = true;
        find_down();
      }
    }
    return grew ? -1 : 1;
  }
  // B's rows of the state (for going back one layer)
  struct BState {
    std::vector<T> tasks;
    std::vector<RepAcc> acc;
  };
  void save_b(BState& s, std::initializer_list<std::vector<T>*> carried) const {
    s.tasks.clear(), s.acc.clear();
    for (size_t r = 0; r < sweep_.size(); ++r) {
      if (!sweep_[r]) continue;
      s.tasks.insert(s.tasks.end(), last_.begin() + static_cast<std::ptrdiff_t>(r * kSimStreams),
                     last_.begin() + static_cast<std::ptrdiff_t>((r + 1) * kSimStreams));
      for (const std::vector<T>* v : carried) s.tasks.push_back((*v)[r]);
      s.acc.push_back(acc_[r]);
    }
  }
  void restore_b(const BState& s, std::initializer_list<std::vector<T>*> carried) {
    size_t i = 0, j = 0;
    for (size_t r = 0; r < sweep_.size(); ++r) {
      if (!sweep_[r]) continue;
      for (int st = 0; st < kSimStreams; ++st) last_[r * kSimStreams + static_cast<size_t>(st)] = s.tasks[i++];
      for (std::vector<T>* v : carried) (*v)[r] = s.tasks[i++];
      acc_[r] = s.acc[j++];
    }
  }

  // After an iteration whose state Period did not find on a line (`period` holds the last three,
  // taped by tape_[0], tape_[1]): moves the ranks on their lines and sweeps the others for up to
  // n iterations, `iterate(m)` sweeping the m-th after the observed one. Returns how many were
  // done (0: none, the state is the observed one again; -1: not tried, nothing swept).
  int64_t partial_jump(Period& period, std::initializer_list<std::vector<T>*> carried, int64_t n,
                       const std::function<void(int64_t)>& iterate) {
    const int R = nreps();
    const Snapshot &s0 = period.s(0), &s1 = period.s(1), &s2 = period.s(2);
    if (s1.next_id - s0.next_id != s2.next_id - s1.next_id || s1.next_coll - s0.next_coll != s2.next_coll - s1.next_coll ||
        s1.ntasks - s0.ntasks != s2.ntasks - s1.ntasks)
      return -1;
    // B: the ranks off their lines, and those a B value reaches (D on both tapes)
    sweep_.assign(static_cast<size_t>(R), 0);
    Period::step_difference(s0, s1, s1, s2, false, nullptr, sweep_.data());
    // the ranks still catching up (their end moves by less than the fastest-moving rank's): each
    // will meet the pace of the others and leave its line; swept from the start
    Period::catching_up(s1, s2, &RepAcc::end, sweep_.data());
    for (;;) {
      const int64_t nb = std::count(sweep_.begin(), sweep_.end(), 1);
      // (-1: not tried, the state untouched.) Over R/8 swept ranks it waits: the band of ranks
      // off their lines shrinks over the first layers (cp=256 no recompute: 100 ranks at the first
      // try, 20 from layer ~12), and each swept layer costs a B share of a full one
      if (nb == 0 || 8 * nb > R) return -1;
      const int c0 = d_check(tape_[0], true);
      if (c0 == 0) return -1;
      const int c1 = d_check(tape_[1], true);
      if (c1 == 0) return -1;
      if (c0 == 1 && c1 == 1) break;
    }
    int64_t v = -1;
    for (int64_t t = 0;; ++t) {
      if (t == n - 1) {  // the last iteration: the verifying sweep
        v = t;
        break;
      }
      save_b(bstate_[t & 1], carried);
      partial_ = true, partial_dm_ = static_cast<double>(t + 1), partial_gathers_ = 0, d_failed_ = false;
      as(SimLayerRun::partial, [&] { iterate(t + 1); });
      partial_ = false;
      if (d_failed_) {  // D failed in layer t: verify layer t - 1
        v = t - 1;
        if (v >= 0) restore_b(bstate_[v & 1], carried);
        break;
      }
    }
    if (v < 0) {
      restore(s2, carried);
      return 0;
    }
    // the verifying sweep from S(v): A placed on its line, B as swept
    period.place(*this, carried, v, sweep_.data());
    next_id_ = s2.next_id + v * (s2.next_id - s1.next_id);
    next_coll_ = s2.next_coll + v * (s2.next_coll - s1.next_coll);
    ntasks_ = s2.ntasks + v * (s2.ntasks - s1.ntasks);
    take(pv_, carried);
    tape_v_.clear(static_cast<size_t>(R));
    tape_out_ = &tape_v_, taping_ = true;
    as(SimLayerRun::probe, [&] { iterate(v + 1); });
    taping_ = false;
    take(wv_, carried);
    bool ok = d_check(tape_v_, false) == 1 && tape_v_.gathers == tape_[1].gathers;
    a_mask_.resize(static_cast<size_t>(R));
    for (int r = 0; r < R; ++r) a_mask_[static_cast<size_t>(r)] = !sweep_[static_cast<size_t>(r)];
    ok = ok && Period::step_difference(s1, s2, pv_, wv_, true, a_mask_.data()) == 0;
    partial_dm_ = static_cast<double>(v + 1);
    auto on_line = [&](double x, double l) { return std::abs(x - l) <= 1e-12 * std::max(std::abs(x), std::abs(l)); };
    for (int r = 0; ok && r < R; ++r)
      if (!sweep_[static_cast<size_t>(r)])
        ok = on_line(tape_v_.pre_end[static_cast<size_t>(r)], tape_line(&Tape::pre_end, r)) &&
             on_line(tape_v_.recv_start[static_cast<size_t>(r)], tape_line(&Tape::recv_start, r)) &&
             on_line(tape_v_.recv_end[static_cast<size_t>(r)], tape_line(&Tape::recv_end, r));
    if (ok && tape_v_.gathers == 1) {
      const double y = tape_[0].gather_arrival, z = tape_[1].gather_arrival;
      ok = on_line(tape_v_.gather_arrival, y == z ? z : z + partial_dm_ * (z - y));
    }
    if (!ok) {
      ++partial_misses_;
      restore(s2, carried);
      return 0;
    }
    ++partial_jumps_;
    partial_layers_ += v;
    partial_ranks_ += v * static_cast<int64_t>(std::count(sweep_.begin(), sweep_.end(), 1));
    return v + 1;
  }

  // ---- one layer forward (also the recompute pass) ----------------------------------------------
  // (`d`, the layer's input, is written over: see collective)
  std::vector<T> layer_forward(int32_t l, SimPass pass, std::vector<T> d, const std::vector<T>& params) {
    if (k_.sp) d = collective(G::self, SimStream::tp, "tp_all_gather", k_.tp_ag, pass, l, std::move(d));
    d = compute("norm_qkv_rope", k_.pre_fwd, pass, l, std::move(d), &params);
    if (k_.ulysses > 1) d = collective(G::ulysses, SimStream::tp, "ulysses_a2a_qkv", k_.a2a_qkv, pass, l, std::move(d));
    d = attention(pass, l, std::move(d), false);
    if (k_.ulysses > 1) d = collective(G::ulysses, SimStream::tp, "ulysses_a2a_out", k_.a2a_out, pass, l, std::move(d));
    d = compute("o_proj_residual_norm", k_.post_fwd, pass, l, std::move(d));
    d = k_.sp ? collective(G::self, SimStream::tp, "tp_reduce_scatter", k_.tp_rs, pass, l, std::move(d))
              : collective(G::self, SimStream::tp, "tp_all_reduce", k_.tp_ar, pass, l, std::move(d));
    if (k_.sp) d = collective(G::self, SimStream::tp, "tp_all_gather", k_.tp_ag, pass, l, std::move(d));
    d = compute("mlp", k_.mlp_fwd, pass, l, std::move(d));
    d = k_.sp ? collective(G::self, SimStream::tp, "tp_reduce_scatter", k_.tp_rs, pass, l, std::move(d))
              : collective(G::self, SimStream::tp, "tp_all_reduce", k_.tp_ar, pass, l, std::move(d));
    return d;
  }

  void forward() {
    const int32_t L = static_cast<int32_t>(k_.layers);
    auto gather = [&](int32_t l, SimPass pass, const std::vector<T>& buffer_free) {
      auto h = host("param_h2d", k_.param_h2d, pass, l, buffer_free);
      return collective(G::zero, SimStream::dp, "zero3_all_gather", k_.zero3_ag, pass, l, std::move(h));
    };
    std::vector<T> d = mb_end_;
    if (d.empty()) d = none();
    // the embedding lookup (its gather under ZeRO-3 first); the lookup copies [T, h] rows and is
    // not priced (memory-bound, far below a layer)
    const auto embed = collective(G::zero, SimStream::dp, "zero3_gather_embedding", k_.zero3_embed_ag, SimPass::forward, -1, d);
    d = compute("embedding", 0.0, SimPass::forward, -1, std::move(d), &embed);
    d = tp_reduce(SimPass::forward, -1, std::move(d));  // the vocab-parallel embedding's partial rows
    std::vector<T> gathered = gather(0, SimPass::forward, d), next;  // this layer's parameters, the next one's
    auto iteration = [&](int32_t l) { profiled(SimPass::forward, l, [&] {
      // prefetch the next layer's parameters while this one runs (two layers' buffers: the buffer
      // is free when the previous layer has ended, which is when this one starts)
      if (l + 1 < L) next = gather(l + 1, SimPass::forward, d);
      if (k_.ckpt_d2h > 0) {
        std::vector<T> out = layer_forward(l, SimPass::forward, d, gathered);
        host("ckpt_d2h", k_.ckpt_d2h, SimPass::forward, l, d);  // after the layer's input (d, its start)
        d = std::move(out);
      } else {
        d = layer_forward(l, SimPass::forward, std::move(d), gathered);
      }
      gathered.swap(next);
    }); };
    Period& period = layer_period_;  // (one for every layer loop: its snapshots are allocated once)
    period.reset();
    const bool partial = partial_possible();
    tapes_ = 0;
    margins_.reset();
    for (int32_t l = 0; l < L; ++l) {
      const bool tape = partial && l + 2 < L;  // what the ranks lend each other, for partial_jump
      if (tape) {
        tape_new_.clear(static_cast<size_t>(nreps()));
        tape_out_ = &tape_new_, taping_ = true;
      }
      margins_.start(!record_ && predict_line_ends_);
      iteration(l);
      margins_.stop();
      taping_ = false;
      // iterations 1 .. L-2 are alike (the first starts from the embedding, the last prefetches
      // nothing): see Period
      if (!record_ && l + 2 < L) {
        if (tape) {
          std::swap(tape_[0], tape_[1]);
          std::swap(tape_[1], tape_new_);
          ++tapes_;
        }
        const int64_t n = (L - 2) - l;  // alike iterations still to come
        int64_t done = 0;
        const bool on_line = period.observe(*this, {&d, &gathered});
        margins_.observed(on_line);
        if (on_line) {
          if (n >= 2)
            done = period.jump(*this, {&d, &gathered}, n, [&](int64_t m) { iteration(l + static_cast<int32_t>(m)); }, margins_.iterations_left());
        } else if (tape && n >= 2 && tapes_ >= 2 && period.seen() == 3) {
          // the whole state is off its line: move the ranks still on theirs, sweep the others
          done = partial_jump(period, {&d, &gathered}, n, [&](int64_t m) { iteration(l + static_cast<int32_t>(m)); });
          if (done > 0) period.reset();  // (its observed states are behind)
          else if (done == 0) tapes_ = 0;  // (undone: not again before two more sweeps)
          done = std::max<int64_t>(0, done);
        }
        if (done > 0) tapes_ = 0, margins_.swept = 0;
        l += static_cast<int32_t>(done);
      }
    }
    fwd_tail_ = d;
  }

  void loss(bool reduce) {
    // ZeRO-3 gathers the final norm (and untied head); a tied head is the embedding, gathered again
    auto params = collective(G::zero, SimStream::dp, "zero3_gather_head", k_.zero3_head_ag, SimPass::forward, -1, fwd_tail_);
    if (k_.tied_embeddings)
      params = collective(G::zero, SimStream::dp, "zero3_gather_embedding", k_.zero3_embed_ag, SimPass::forward, -1, std::move(params));
    auto x = tp_gather(SimPass::forward, -1, fwd_tail_);  // the final norm's output
    auto d = compute("head_loss", k_.head_fwd, SimPass::forward, -1, std::move(x), &params);
    // per logits tile, the vocab-parallel statistics (row max, then sum of exp and target logit);
    // the first tile's gradient follows its statistics, the other tiles' after theirs
    auto stats = [&](SimPass pass, std::vector<T> y) {
      y = collective(G::self, SimStream::tp, "loss_tp_all_reduce", k_.loss_max_ar, pass, -1, std::move(y));
      return collective(G::self, SimStream::tp, "loss_tp_all_reduce", k_.loss_sum_ar, pass, -1, std::move(y));
    };
    d = stats(SimPass::forward, std::move(d));
    d = compute("head_loss_bwd", k_.head_bwd, SimPass::backward, -1, std::move(d));
    for (int64_t t = 1; t < k_.loss_tiles; ++t) d = stats(SimPass::backward, std::move(d));
    loss_end_ = tp_reduce(SimPass::backward, -1, std::move(d));  // d(final norm output) over TP
    if (reduce) {
      auto f = tp_fixups(-1, k_.tp_fixups_norm_final, 0, loss_end_);
      collective(G::zero, SimStream::dp, "head_grad_reduce", k_.head_grad_reduce, SimPass::backward, -1, std::move(f));
    }
  }

  void backward(bool reduce) {
    const int32_t L = static_cast<int32_t>(k_.layers);
    std::vector<T> d = loss_end_;
    auto gather = [&](int32_t l, const std::vector<T>& buffer_free) {
      auto h = host("param_h2d", k_.param_h2d, SimPass::backward, l, buffer_free);
      return collective(G::zero, SimStream::dp, "zero3_all_gather", k_.zero3_ag, SimPass::backward, l, std::move(h));
    };
    auto fetch_ckpt = [&](int32_t l, const std::vector<T>& buffer_free) {
      return host("ckpt_h2d", k_.ckpt_h2d, SimPass::backward, l, buffer_free);
    };
    // this layer's parameters and checkpoint, and the next (lower) layer's, prefetched when the
    // layer above has finished its backward (which is when this one starts)
    std::vector<T> gathered = gather(L - 1, d), next_gathered = none();
    std::vector<T> ckpt_in = k_.ckpt_h2d > 0 ? fetch_ckpt(L - 1, d) : none(), next_ckpt = none();
    std::vector<T> last_reduce = none();
    auto iteration = [&](int32_t l) { profiled(SimPass::backward, l, [&] {
      if (l >= 1) {
        next_gathered = gather(l - 1, d);
        if (k_.ckpt_h2d > 0) next_ckpt = fetch_ckpt(l - 1, d);
      }
      const auto& params = gathered;
      std::vector<T> x = std::move(d);  // (d is this iteration's output again at its end)
      if (k_.ckpt_h2d > 0)  // the layer's checkpoint must be back on the device (a join, no work)
        x = compute("checkpoint_ready", 0.0, SimPass::backward, l, std::move(x), &ckpt_in);
      if (k_.recompute == Recompute::full) x = layer_forward(l, SimPass::recompute, std::move(x), params);
      // backward of the MLP half: d(out) gathered, and the recomputed norm output again (under SP
      // the weight gradient needs the whole sequence's input)
      x = tp_gather(SimPass::backward, l, std::move(x));
      x = tp_gather(SimPass::backward, l, std::move(x));
      x = compute("mlp_bwd", k_.mlp_bwd, SimPass::backward, l, std::move(x), &params);
      x = k_.sp ? collective(G::self, SimStream::tp, "tp_reduce_scatter", k_.tp_rs, SimPass::backward, l, std::move(x))
                : collective(G::self, SimStream::tp, "tp_all_reduce", k_.tp_ar, SimPass::backward, l, std::move(x));
      // backward of the attention half
      if (k_.sp) x = collective(G::self, SimStream::tp, "tp_all_gather", k_.tp_ag, SimPass::backward, l, std::move(x));
      // selective recompute rematerialises the attention core where its backward needs it, after
      // the MLP's backward (as Megatron's and ctxrun's do)
      // (under Ulysses from the saved sequence layout: q, k, v to the head layout and o back)
      if (k_.recompute == Recompute::selective) {
        if (k_.ulysses > 1) x = collective(G::ulysses, SimStream::tp, "ulysses_a2a_qkv", k_.a2a_qkv, SimPass::recompute, l, std::move(x));
        x = attention(SimPass::recompute, l, std::move(x), false);
        if (k_.ulysses > 1) x = collective(G::ulysses, SimStream::tp, "ulysses_a2a_out", k_.a2a_out, SimPass::recompute, l, std::move(x));
      }
      x = compute("o_proj_residual_norm_bwd", k_.post_bwd, SimPass::backward, l, std::move(x));
      // Ulysses: q, k, v, o (saved in the sequence layout) and d(out) to the head layout
      if (k_.ulysses > 1) x = collective(G::ulysses, SimStream::tp, "ulysses_a2a_out", k_.a2a_bwd_in, SimPass::backward, l, std::move(x));
      x = attention(SimPass::backward, l, std::move(x), true);
      if (k_.ulysses > 1) x = collective(G::ulysses, SimStream::tp, "ulysses_a2a_qkv", k_.a2a_qkv, SimPass::backward, l, std::move(x));
      x = tp_gather(SimPass::backward, l, std::move(x));  // the recomputed norm output, for the QKV weight gradients
      x = compute("norm_qkv_rope_bwd", k_.pre_bwd, SimPass::backward, l, std::move(x));
      x = k_.sp ? collective(G::self, SimStream::tp, "tp_reduce_scatter", k_.tp_rs, SimPass::backward, l, std::move(x))
                : collective(G::self, SimStream::tp, "tp_all_reduce", k_.tp_ar, SimPass::backward, l, std::move(x));
      if (reduce) {
        auto f = tp_fixups(l, k_.tp_fixups_norm_per_layer, k_.tp_fixups_kv_per_layer, x);
        last_reduce = collective(G::zero, SimStream::dp, "grad_reduce", k_.grad_reduce, SimPass::backward, l, std::move(f));
      }
      d = std::move(x);
      gathered.swap(next_gathered);
      ckpt_in.swap(next_ckpt);
    }); };
    Period& period = layer_period_;  // (one for every layer loop: its snapshots are allocated once)
    period.reset();
    margins_.reset();
    for (int32_t l = L - 1; l >= 0; --l) {
      margins_.start(!record_ && predict_line_ends_);
      iteration(l);
      margins_.stop();
      // iterations L-2 .. 1 are alike (the top one starts from the loss, the bottom one prefetches
      // nothing): see Period
      if (!record_ && l + 1 < L) {
        const int64_t n = l - 1;  // alike iterations still to come
        const bool on_line = period.observe(*this, {&d, &gathered, &ckpt_in, &last_reduce});
        margins_.observed(on_line);
        if (on_line && n >= 2) {
          const int64_t done = period.jump(*this, {&d, &gathered, &ckpt_in, &last_reduce}, n,
                                           [&](int64_t m) { iteration(l - static_cast<int32_t>(m)); }, margins_.iterations_left());
          if (done > 0) margins_.swept = 0;  // (the observed states are the jump's far end now, not taped)
          l -= static_cast<int32_t>(done);
        }
      }
    }
    d = tp_gather(SimPass::backward, -1, std::move(d));  // d(embedding output), whole sequence
    d = compute("embedding_bwd", 0.0, SimPass::backward, -1, std::move(d));  // scatter-add into the table, not priced (as its forward)
    if (reduce) last_reduce = collective(G::zero, SimStream::dp, "embed_grad_reduce", k_.embed_grad_reduce, SimPass::backward, -1, d);
    // the next micro-batch starts when this one's compute is done; reductions drain behind it
    mb_end_ = d;
    if (reduce) reduce_end_ = last_reduce;
  }

  void optimizer() {
    mb_ = k_.ga - 1;
    std::vector<T> d = reduce_end_.empty() ? mb_end_ : reduce_end_;
    for (int r = 0; r < nreps(); ++r)  // the optimizer needs the compute and the reductions done
      if (d[static_cast<size_t>(r)].id < 0) d[static_cast<size_t>(r)] = mb_end_[static_cast<size_t>(r)];
    std::vector<T> after_compute = mb_end_;
    if (k_.opt_host > 0) {
      std::vector<T> x(static_cast<size_t>(nreps()));
      for (int r = 0; r < nreps(); ++r) {
        const T& a = d[static_cast<size_t>(r)];
        const T& b = after_compute[static_cast<size_t>(r)];
        x[static_cast<size_t>(r)] = a.id < b.id ? b : a;  // the later-created of the two (as the task ids' max)
      }
      x = host("grads_d2h", k_.opt_d2h, SimPass::optimizer, -1, std::move(x), SimCategory::optimizer);
      x = host("cpu_adamw", k_.opt_host, SimPass::optimizer, -1, std::move(x), SimCategory::optimizer);
      x = host("params_h2d", k_.opt_h2d, SimPass::optimizer, -1, std::move(x), SimCategory::optimizer);
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
  bool record_ = true;
  int ring_closed_form_min_ranks_ = kRingClosedFormMinRanks;
  bool ring_closed_form_failed_ = false;  // the closed form gave way (ring_backward_by_rank returned false)
  int64_t mb_ = 0;
  int64_t next_coll_ = 0;
  int64_t next_id_ = 0;
  int64_t ntasks_ = 0;
  int64_t jumps_ = 0, layers_skipped_ = 0, micro_batches_skipped_ = 0, jump_misses_ = 0;  // periodicity: jumps taken, layer iterations not swept, checks failed
  int64_t far_first_misses_ = 0;  // of those, first probes at the farthest distance (Period::jump)
  std::vector<const std::vector<double>*> ring_cost_of_[2];  // ring_costs: forward, backward
  std::vector<double> ring_first_cost_[2], ring_last_cost_[2];  // (their step-0 and last-step costs)
  std::vector<int> ring_sender_;                             // ring_senders
  std::vector<T> none_;                                      // none()
  std::vector<T> last_;  // last task per (rep, stream)
  std::vector<RepAcc> acc_;
  std::vector<T> fwd_tail_, loss_end_, mb_end_, reduce_end_;
  Period layer_period_;  // the layer loops'
  std::unordered_map<const std::vector<double>*, CostRuns> cost_runs_;  // ring_forward_by_rank's
  std::vector<int64_t> raw_starts_;                                                 // (cost_runs' scratch)
  std::vector<std::pair<const std::vector<double>*, const CostRuns*>> runs_of_rep_;  // per rank: its cost vector's runs
  std::vector<double> first_end_;
  std::vector<int> ng_, ng_cycle_;
  Upstream upstream_;  // ring_forward_by_rank's range queries over the first ends
  std::vector<char> ng_seen_;
  struct NgEntry {
    int64_t pos;
    int rank;
    double value;
  };
  std::vector<NgEntry> ng_stack_;
  std::vector<RingBackwardRank> ring_in_;  // ring_backward's
  std::vector<RingBackwardResult> ring_out_;
  RingBackwardWork ring_work_;
  std::vector<int32_t> coll_of_key_, key_of_;  // collective()'s scratch
  std::vector<double> arrival_;
  std::vector<int64_t> ng_hops_;
  // the partial sweep's (partial_jump)
  int partial_min_ranks_ = kPartialSweepMinRanks;
  bool partial_ = false, taping_ = false, d_failed_ = false;  // sweeping only sweep_'s ranks; taping into tape_out_; D failed
  double partial_dm_ = 0;  // the tapes' line at this many iterations past the last taped one
  int partial_gathers_ = 0;
  Tape* tape_out_ = nullptr;
  Tape tape_[2], tape_new_, tape_v_;  // the last two swept iterations' (tape_[1] the later), the current one's, the verifying sweep's
  int tapes_ = 0;  // how many iterations in a row were swept and taped
  std::vector<char> sweep_, a_mask_;
  std::vector<int> down_;
  BState bstate_[2];
  Snapshot pv_, wv_;
  int64_t partial_jumps_ = 0, partial_layers_ = 0, partial_misses_ = 0, partial_ranks_ = 0;
  int64_t rise_searches_ = 0;
  bool predict_line_ends_ = true;
  // the layer profile (simulate_step's `profile`): the kind of iteration running, and the backward
  // ring's closed-form ranks counted so far
  SimProfile* profile_ = nullptr;
  SimLayerRun::Kind run_kind_ = SimLayerRun::swept;
  int64_t ring_computed_ = 0, ring_moved_ = 0, ring_gave_way_ = 0;
  Margins margins_;  // taped by the layer loops' swept iterations, read by Period::jump
  int64_t kinks_predicted_ = 0, kink_misses_ = 0;

 public:
  int64_t partial_jumps() const { return partial_jumps_; }
  int64_t partial_layers() const { return partial_layers_; }
  int64_t partial_misses() const { return partial_misses_; }
  int64_t partial_ranks() const { return partial_ranks_; }
  int64_t rise_searches() const { return rise_searches_; }
  int64_t kinks_predicted() const { return kinks_predicted_; }
  int64_t kink_misses() const { return kink_misses_; }
  int64_t collectives() const { return next_coll_; }
  int64_t tasks() const { return ntasks_; }
  int64_t jumps() const { return jumps_; }
  int64_t layers_extrapolated() const { return layers_skipped_; }
  int64_t jump_misses() const { return jump_misses_; }
  int64_t far_first_misses() const { return far_first_misses_; }
  int64_t micro_batches_extrapolated() const { return micro_batches_skipped_; }
  const std::vector<RepAcc>& reps() const { return acc_; }
};

}  // namespace

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

SimResult simulate_step(const StepCosts& k, const Plan& p, SimRecord record, int ring_closed_form_min_ranks, int partial_sweep_min_ranks,
                        bool predict_line_ends, SimProfile* profile) {
  auto t0 = std::chrono::steady_clock::now();
  SimResult r;
  Builder b(k, p, r, record == SimRecord::tasks, ring_closed_form_min_ranks, partial_sweep_min_ranks, predict_line_ends, profile);
  b.build();
  const auto& acc = b.reps();
  r.stats.tasks = b.tasks();
  r.stats.events = b.tasks();
  r.stats.periodic_jumps = b.jumps();
  r.stats.layers_extrapolated = b.layers_extrapolated();
  r.stats.jump_misses = b.jump_misses();
  r.stats.far_first_misses = b.far_first_misses();
  r.stats.micro_batches_extrapolated = b.micro_batches_extrapolated();
  r.stats.partial_jumps = b.partial_jumps();
  r.stats.layers_partially_swept = b.partial_layers();
  r.stats.partial_misses = b.partial_misses();
  r.stats.partial_rank_layers = b.partial_ranks();
  r.stats.rise_searches = b.rise_searches();
  r.stats.kinks_predicted = b.kinks_predicted();
  r.stats.kink_misses = b.kink_misses();
  for (size_t i = 0; i < acc.size(); ++i) {
    r.reps[i].compute_stream_busy_s = acc[i].stream_busy;
    r.reps[i].end_s = acc[i].end;
  }
  // step time: the last task anywhere; the critical rank finishes last
  double step = 0;
  for (size_t i = 0; i < acc.size(); ++i)
    if (acc[i].end > step) { step = acc[i].end; r.critical_rep = static_cast<int>(i); }
  r.breakdown_rep = static_cast<int>(
      std::min_element(acc.begin(), acc.end(), [](const RepAcc& x, const RepAcc& y) { return x.busy < y.busy; }) - acc.begin());
  // phases on the critical rank: forward (incl. the loss forward) of each micro-batch, backward, optimizer
  const double fwd = acc[static_cast<size_t>(r.critical_rep)].fwd_sum;
  const double opt_start = std::min(step, acc[static_cast<size_t>(r.critical_rep)].opt_start);
  r.time.method = "simulated";
  r.time.step_seconds = step;
  r.time.phase_seconds[static_cast<int>(TimePhase::forward)] = std::min(fwd, step);
  r.time.phase_seconds[static_cast<int>(TimePhase::optimizer)] = std::max(0.0, step - opt_start);
  r.time.phase_seconds[static_cast<int>(TimePhase::backward)] =
      std::max(0.0, step - r.time.phase_seconds[0] - r.time.phase_seconds[static_cast<int>(TimePhase::optimizer)]);
  // the breakdown on the rank that waits most: after its last compute task, its own trailing work
  // (reductions, host optimizer), then waiting for the rest
  const RepAcc& a = acc[static_cast<size_t>(r.breakdown_rep)];
  StepBreakdown bd = a.b;
  double own_end = a.last.id >= 0 ? a.last.end : a.prev_end;
  if (own_end > a.prev_end) Builder::attribute(bd, r.breakdown_rep, own_end - a.prev_end, a.last);
  if (step > own_end) bd.imbalance += step - own_end;
  r.time.breakdown = bd;
  finish_step_time(k, r.time);
  r.stats.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

json chrome_trace(const SimResult& r, const std::string& title) {
  json events = json::array();
  for (size_t i = 0; i < r.reps.size(); ++i) {
    int64_t pid = r.reps[i].rank;
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", pid}, {"args", {{"name", r.reps[i].label}}}});
    events.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", pid}, {"args", {{"sort_index", i}}}});
    for (int s = 0; s < kSimStreams; ++s)
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", pid}, {"tid", s},
                        {"args", {{"name", to_string(static_cast<SimStream>(s))}}}});
  }
  static const char* pass_names[] = {"forward", "recompute", "backward", "optimizer"};
  for (const SimTask& t : r.tasks) {
    if (t.duration <= 0) continue;
    json e = {{"name", t.name}, {"ph", "X"}, {"pid", r.reps[static_cast<size_t>(t.rep)].rank}, {"tid", static_cast<int>(t.stream)},
              {"ts", t.start * 1e6}, {"dur", t.duration * 1e6}, {"cat", pass_names[static_cast<int>(t.pass)]}};
    json args = {{"layer", t.layer}, {"micro_batch", t.micro_batch}};
    if (t.start > t.ready + 1e-12) args["waited_for_other_ranks_us"] = (t.start - t.ready) * 1e6;
    e["args"] = args;
    events.push_back(std::move(e));
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", {{"title", title}}}};
}

}  // namespace ctx
