#include "planner/search.hpp"

#include "costmodel/pipeline_stages.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>
#include <queue>
#include <set>
#include <sstream>
#include <tuple>

#include "costmodel/errors.hpp"
#include "costmodel/pipeline_time.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/simulator.hpp"

namespace ctx {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

// std::stable_sort(v, less) by sorting indices, then moving each element once: the same order (a
// stable sort's result is unique), without moving the large Candidates O(n log n) times
template <class T, class Less>
void stable_sort_moving_once(std::vector<T>& v, size_t first, size_t last, Less less) {
  std::vector<uint32_t> idx(last - first);
  std::iota(idx.begin(), idx.end(), static_cast<uint32_t>(first));
  std::stable_sort(idx.begin(), idx.end(), [&](uint32_t a, uint32_t b) { return less(v[a], v[b]); });
  std::vector<T> sorted;
  sorted.reserve(idx.size());
  for (uint32_t i : idx) sorted.push_back(std::move(v[i]));
  std::move(sorted.begin(), sorted.end(), v.begin() + static_cast<std::ptrdiff_t>(first));
}

// Why check_plan refuses a plan the search enumerated, as the search reports it ("<plan, filled>: <reasons>"):
// the text plan_valid does not build, made only for the plan a person will read about
std::string refusal(Plan p, const ModelSpec& m, const ClusterSpec& c, int64_t seq) {
  const std::string why = check_plan(p, m, c, seq).message();  // (fills p: dp, ulysses)
  return plan_to_string(p) + ": " + why;
}

bool allowed(const std::vector<int64_t>& only, int64_t v) { return only.empty() || std::find(only.begin(), only.end(), v) != only.end(); }

// Pipeline degrees the search tries: 1, then the divisors of the layers that divide the GPUs, up
// to kMaxSearchedPp stages (the largest Megatron and NeMo tables use for dense models: Llama 3.1
// 405B trains with pp=16, Llama 3 paper sec. 3.3.2), restricted by req.pp_values.
constexpr int64_t kMaxSearchedPp = 16;
std::vector<int64_t> pipeline_search_degrees(const SearchRequest& req) {
  std::vector<int64_t> out;
  const int64_t world = world_size(req.cluster);
  if (req.fixed_fields.contains("pp")) {  // the user's pp, whatever the search would try
    if (world % req.base.pp == 0) out.push_back(req.base.pp);
    return out;
  }
  // with an uneven split given (pp_first, pp_last, pp_embed, pp_loss), every pp that builds it
  const bool uneven = req.fixed_fields.contains("pp_first") || req.fixed_fields.contains("pp_last") ||
                      req.fixed_fields.contains("pp_embed") || req.fixed_fields.contains("pp_loss");
  for (int64_t pp = 1; pp <= kMaxSearchedPp; ++pp) {
    if (world % pp != 0 || !allowed(req.pp_values, pp)) continue;
    Plan q = req.base;
    q.pp = pp;
    q.vpp = 1;
    if (req.model.layers % pp == 0 || (uneven && pp > 1 && pipeline_split_error(req.model.layers, q).empty())) out.push_back(pp);
  }
  if (out.empty() || out.front() != 1) {
    if (allowed(req.pp_values, 1)) out.insert(out.begin(), 1);
  }
  return out;
}

// The values the search tries on one axis: the user's value when --plan fixes the field
// (req.fixed_fields; req.base holds the parsed --plan), else `searched`.
template <class T>
std::vector<T> axis(const SearchRequest& req, const char* field, T given, std::vector<T> searched) {
  if (req.fixed_fields.contains(field)) return {given};
  return searched;
}

// Calls f(plan) for every plan of the search space, in a fixed order. `with_batch` enumerates
// micro-batch splits and rank orders (they change time, not memory per sequence... except mbs).
template <class F>
void for_each_plan(const SearchRequest& req, bool with_time_knobs, F&& f) {
  const ClusterSpec& c = req.cluster;
  const int64_t world = world_size(c);
  std::vector<CpKind> kinds = req.cp_kinds;
  if (kinds.empty()) kinds = {CpKind::zigzag, CpKind::ring, CpKind::allgather, CpKind::ulysses, CpKind::usp};
  const bool offload = req.allow_offload;
  // Constraints (--plan): every field the user gave is kept in every plan (fixed_plan_fields). An
  // axis the user fixed is enumerated at the user's value only; plan_to_json's check at the end
  // (keeps_fixed_fields) catches what the axes cannot (a shorthand that fixes several fields).
  const json& fx = req.fixed_fields;
  const Plan& g = req.base;
  auto has = [&](const char* f) { return fx.contains(f); };
  // pipeline stages: 1, then divisors of the layers up to kMaxSearchedPp (pipeline_search_degrees)
  for (int64_t pp : pipeline_search_degrees(req)) {
  for (int64_t tp : axis(req, "tp", g.tp, divisors(std::min(world / pp, c.gpus_per_node)))) {
    if (!allowed(req.tp_values, tp) || world % (tp * pp) != 0) continue;
    for (int64_t cp : axis(req, "cp", g.cp, divisors(world / (tp * pp)))) {
      if (!allowed(req.cp_values, cp) || world % (tp * pp * cp) != 0) continue;
      const int64_t dp = world / (tp * cp * pp);
      if (has("dp") && g.dp > 0 && dp != g.dp) continue;  // dp=0 (fill the GPUs) constrains nothing
      // sequences per data-parallel rank per step
      int64_t per_dp = 1;
      if (req.global_batch_tokens == 0 && (has("mbs") || has("ga"))) per_dp = g.mbs * g.ga;  // the user's batch
      if (req.global_batch_tokens > 0) {
        int64_t seqs = req.global_batch_tokens / req.seq;
        if (seqs < dp || seqs % dp != 0 || req.global_batch_tokens % req.seq != 0) continue;
        per_dp = seqs / dp;
      }
      struct CpChoice { CpKind kind; int64_t u; CpLayout layout; CpVarlen varlen; };
      std::vector<CpChoice> layouts;  // (kind, ulysses degree for usp, layout, variable-length strategy)
      auto add_kind = [&](CpKind k, int64_t u) {
        Plan named;
        set_cp_kind(named, k);
        layouts.push_back({k, u, named.cp_layout, CpVarlen{}});
        // packed documents: the per-document head-tail layout (TE THD) where the exchange balances a
        // layout, and the variable-length strategies where K,V pass around a ring
        const bool docs = req.base.mask == MaskKind::document;
        if (!docs || named.cp_comm == CpComm::a2a) return;
        if (k != CpKind::ring) layouts.push_back({k, u, CpLayout::headtail_doc, CpVarlen{}});
        if (named.cp_comm == CpComm::p2p || named.cp_comm == CpComm::a2a_p2p)
          for (CpVarlen v : {CpVarlen{CpVarlen::Kind::cycle, 0}, CpVarlen{CpVarlen::Kind::split, 4}})
            layouts.push_back({k, u, k == CpKind::ring ? named.cp_layout : CpLayout::headtail_doc, v});
      };
      if (cp == 1) {
        // no CP: the CP fields are the user's where given (they are moot at cp=1 and keep it)
        const bool cp_given = has("cp_kind") || has("cp_comm") || has("cp_layout");
        layouts.push_back({cp_given ? cp_kind_of(g) : CpKind::zigzag, 0, cp_given ? g.cp_layout : CpLayout::headtail,
                           has("cp_varlen") ? g.cp_varlen : CpVarlen{}});
      } else {
        for (CpKind k : kinds) {
          if (k == CpKind::usp) {
            for (int64_t u : divisors(cp))
              if (u > 1 && u < cp) add_kind(k, u);
          } else {
            add_kind(k, 0);
          }
        }
      }
      if (has("ulysses") || has("cp_layout") || has("cp_varlen")) {  // the user's CP fields replace the searched ones
        for (CpChoice& ch : layouts) {
          if (has("ulysses") && ch.kind == CpKind::usp) ch.u = g.ulysses;
          if (has("cp_layout")) ch.layout = g.cp_layout;
          if (has("cp_varlen")) ch.varlen = g.cp_varlen;
        }
        std::vector<CpChoice> unique;
        for (const CpChoice& ch : layouts)
          if (std::none_of(unique.begin(), unique.end(), [&](const CpChoice& o) {
                return o.kind == ch.kind && o.u == ch.u && o.layout == ch.layout && o.varlen == ch.varlen;
              }))
            unique.push_back(ch);
        layouts = std::move(unique);
      }
      // p keeps every key the user gave (fx): true when nothing is fixed, else plan_to_json's fields,
      // and the runtime can run it (its capabilities, runtime_capabilities.hpp)
      auto keeps = [&](const Plan& p) {
        return runtime_runs(req.runtime.capabilities, p) && (fx.empty() || keeps_fixed_fields(p, fx));
      };
      auto bits = [](bool both) { return both ? std::vector<int>{0, 1} : std::vector<int>{0}; };  // off, or off and on
      // the plan, and with TP communication overlap where the plan can run it (tp > 1 with SP) and the
      // runtime allows it (keeps: its capabilities; a flag, Megatron's --tp-comm-overlap); false: f asked to stop
      const bool try_overlap = with_time_knobs && !has("tp_overlap") && c.gpu.sm_count > 0;
      auto emit = [&](Plan& p) {
        if (keeps(p) && !f(p)) return false;
        if (try_overlap && p.tp > 1 && sp_enabled(p)) {
          Plan q = p;
          q.tp_overlap = true;
          if (keeps(q) && !f(q)) return false;
        }
        return true;
      };
      for (auto [kind, u, layout, varlen] : layouts) {
        for (int zero : axis(req, "zero", g.zero, std::vector<int>{0, 1, 2, 3})) {
          if (pp > 1 && zero > 1) continue;  // ZeRO-2/3 do not pipeline (plan_check.cpp)
          // HSDP (zero_shard): shard over one node's dp x cp ranks (gpus_per_node / tp), replicate across nodes
          std::vector<int64_t> shards{0};
          if (const int64_t n = c.gpus_per_node / tp; zero >= 1 && n > 1 && n < dp * cp && (dp * cp) % n == 0) shards.push_back(n);
          for (int64_t zshard : axis(req, "zero_shard", g.zero_shard, shards)) {
          for (int rec : axis(req, "recompute", static_cast<int>(g.recompute), std::vector<int>{0, 1, 2})) {
            for (int opt_off : axis(req, "opt_offload", static_cast<int>(g.opt_offload), bits(offload))) {
              // checkpoint offload holds full-recompute checkpoints; parameter offload, ZeRO-3 shards
              for (int ckpt_off : axis(req, "ckpt_offload", static_cast<int>(g.ckpt_offload), bits(offload && rec == 2))) {
                for (int param_off : axis(req, "param_offload", static_cast<int>(g.param_offload), bits(offload && zero == 3))) {
                  // ZeRO on one rank shards nothing: only with parameter or optimizer offload (ALST's
                  // single-GPU plan: ZeRO-3 with both in host memory), where it is what DeepSpeed runs
                  if (dp * cp == 1 && zero > 0 && !has("zero") && !(zero == 3 && (param_off || opt_off))) continue;
                  for (int64_t tm : axis(req, "tiled_mlp", g.tiled_mlp, std::vector<int64_t>{0, -1})) {
                  for (int64_t tl : axis(req, "tiled_loss", g.tiled_loss, std::vector<int64_t>{0, 4096})) {
                    Plan p = req.base;
                    p.tp = tp;
                    p.cp = cp;
                    p.dp = dp;
                    p.sp = has("sp") ? g.sp : -1;
                    p.tp_overlap = has("tp_overlap") && g.tp_overlap;
                    set_cp_kind(p, kind);
                    p.cp_layout = layout;
                    p.cp_varlen = varlen;
                    p.ulysses = u;
                    p.zero = zero;
                    p.zero_shard = zshard;
                    p.recompute = static_cast<Recompute>(rec);
                    p.opt_offload = opt_off;
                    p.ckpt_offload = ckpt_off;
                    p.param_offload = param_off;
                    p.tiled_loss = tl;
                    p.tiled_mlp = tm;
                    p.pp = pp;
                    p.vpp = 1;
                    // an uneven pipeline split only as the user gives it (plan_check refuses it where the pp does not build it)
                    p.pp_first = has("pp_first") && pp > 1 ? g.pp_first : 0;
                    p.pp_last = has("pp_last") && pp > 1 ? g.pp_last : 0;
                    p.pp_embed = has("pp_embed") && pp > 1 && g.pp_embed;
                    p.pp_loss = has("pp_loss") && pp > 1 && g.pp_loss;
                    std::vector<int64_t> mbs_values{1};
                    if (has("mbs")) mbs_values = {g.mbs};
                    else if (with_time_knobs)
                      for (int64_t m : divisors(per_dp))
                        if (m > 1 && m <= 8) mbs_values.push_back(m);
                    for (int64_t mbs : mbs_values) {
                      if (mbs < 1 || per_dp % mbs != 0) continue;
                      p.mbs = mbs;
                      p.ga = per_dp / mbs;
                      if (has("ga") && p.ga != g.ga) continue;
                      std::vector<int64_t> vpps{1};
                      // interleaved 1F1B with two chunks where Megatron runs it (ga divisible by pp)
                      if (has("vpp")) vpps = {g.vpp};
                      else if (with_time_knobs && pp > 1 && p.ga % pp == 0 && req.model.layers % (2 * pp) == 0 &&
                               !(p.pp_first || p.pp_last || p.pp_embed || p.pp_loss)) vpps = {2, 1};
                      for (int64_t vpp : vpps) {
                        p.vpp = vpp;
                        if (has("order")) {
                          std::copy(std::begin(g.order), std::end(g.order), std::begin(p.order));
                          if (!emit(p)) return;
                          continue;
                        }
                        p.order[0] = Dim::tp; p.order[1] = Dim::cp; p.order[2] = Dim::dp;
                        if (!emit(p)) return;
                        if (vpp == 1 && with_time_knobs && tp > 1 && cp > 1) {  // CP innermost: ring hops on NVLink, TP across
                          p.order[0] = Dim::cp; p.order[1] = Dim::tp;
                          if (!emit(p)) return;
                        }
                      }
                    }
                  }
                  }
                }
              }
            }
          }
          }
        }
      }
    }
  }
  }
}

std::string diff_keys(const Plan& a, const Plan& b) {
  // the key=value items of a's canonical text that b does not share
  auto items = [](const std::string& s) {
    std::vector<std::string> v;
    std::stringstream ss(s);
    std::string it;
    while (std::getline(ss, it, ',')) v.push_back(it);
    return v;
  };
  auto ia = items(plan_to_string(a)), ib = items(plan_to_string(b));
  std::string out;
  for (auto& x : ia)
    if (std::find(ib.begin(), ib.end(), x) == ib.end()) out += (out.empty() ? "" : ",") + x;
  return out.empty() ? "same keys" : out;
}

std::string seconds(double s) {
  char buf[32];
  if (s >= 1) std::snprintf(buf, sizeof buf, "%.2f s", s);
  else std::snprintf(buf, sizeof buf, "%.0f ms", s * 1e3);
  return buf;
}

// Why the plan's CP layout and variable-length strategy (issue 20): its imbalance, and each other
// layout or strategy the search priced for the same plan, with how much slower it is.
std::string explain_cp(const std::vector<Candidate>& fitting, size_t i) {
  const Candidate& a = fitting[i];
  if (a.plan.cp <= 1) return "";
  // plan_to_string begins "dp=..,tp=..,cp=.." and names zero and mbs only with their own keys:
  // plans that differ in one of them have different texts, family() is built only for the others
  auto may_share = [&](const Plan& q) {
    return q.dp == a.plan.dp && q.tp == a.plan.tp && q.cp == a.plan.cp && q.zero == a.plan.zero && q.mbs == a.plan.mbs;
  };
  auto family = [](Plan p) {
    p.cp_layout = CpLayout::headtail;
    p.cp_varlen = CpVarlen{};
    return plan_to_string(p);
  };
  const std::string key = family(a.plan);
  std::ostringstream os;
  os << "; cp_layout=" << to_string(a.plan.cp_layout);
  if (a.plan.mask == MaskKind::document) os << ",cp_varlen=" << to_string(a.plan.cp_varlen);
  os.setf(std::ios::fixed);
  os.precision(1);
  os << " (imbalance " << 100.0 * a.time.breakdown.imbalance / std::max(1e-30, a.time.step_seconds) << "% of the step)";
  std::vector<std::string> others;
  for (const Candidate& c : fitting) {
    if (&c == &a || (c.plan.cp_layout == a.plan.cp_layout && c.plan.cp_varlen == a.plan.cp_varlen) || !may_share(c.plan) ||
        family(c.plan) != key)
      continue;
    std::ostringstream o;
    o.setf(std::ios::fixed);
    o.precision(2);
    o << "cp_layout=" << to_string(c.plan.cp_layout);
    if (c.plan.mask == MaskKind::document) o << ",cp_varlen=" << to_string(c.plan.cp_varlen);
    o << " " << c.time.step_seconds / std::max(1e-30, a.time.step_seconds) << "x the step";
    others.push_back(o.str());
  }
  if (!others.empty()) {
    os << "; vs ";
    for (size_t j = 0; j < others.size(); ++j) os << (j ? ", " : "") << others[j];
  }
  return os.str();
}

std::string explain(const Candidate& a, const Candidate* next, Objective obj) {
  const StepBreakdown& b = a.time.breakdown;
  std::vector<std::pair<double, std::string>> parts = {{b.compute, "compute"},
                                                       {b.exposed_comm, "exposed comm"},
                                                       {b.offload_stall, "offload stalls"},
                                                       {b.imbalance, "imbalance"},
                                                       {b.optimizer, "optimizer"}};
  std::sort(parts.begin(), parts.end(), [](auto& x, auto& y) { return x.first > y.first; });
  std::ostringstream os;
  os << "step " << seconds(a.time.step_seconds) << " = " << parts[0].second << " " << seconds(parts[0].first);
  if (parts[1].first > 0.01 * a.time.step_seconds) os << " + " << parts[1].second << " " << seconds(parts[1].first);
  os << "; " << std::fixed;
  os.precision(1);
  os << a.peak_bytes / (1024.0 * 1024 * 1024) << " GiB peak";
  if (next) {
    os << "; vs next (" << diff_keys(next->plan, a.plan) << "): ";
    if (obj == Objective::time) {
      double dt = next->time.step_seconds - a.time.step_seconds;
      if (std::abs(next->time.tokens_per_second - a.time.tokens_per_second) > 1e-9 * a.time.tokens_per_second &&
          std::abs(next->tokens_per_step() - a.tokens_per_step()) > 0.5) {
        os << a.time.tokens_per_second / next->time.tokens_per_second << "x the tokens/s";
        return os.str();
      }
      const StepBreakdown& n = next->time.breakdown;
      std::vector<std::pair<double, std::string>> d = {{n.compute - b.compute, "compute"},
                                                       {n.exposed_comm - b.exposed_comm, "exposed comm"},
                                                       {n.offload_stall - b.offload_stall, "offload stalls"},
                                                       {n.imbalance - b.imbalance, "imbalance"},
                                                       {n.optimizer - b.optimizer, "optimizer"}};
      std::sort(d.begin(), d.end(), [](auto& x, auto& y) { return std::abs(x.first) > std::abs(y.first); });
      os << seconds(dt) << " faster";
      if (std::abs(d[0].first) > 1e-6) os << " (mostly " << d[0].second << " " << (d[0].first > 0 ? "-" : "+") << seconds(std::abs(d[0].first)) << ")";
    } else {
      os << (next->peak_bytes - a.peak_bytes) / (1024.0 * 1024 * 1024) << " GiB less";
    }
  }
  return os.str();
}

// Unpriced pipeline plans that could stand on the Pareto frontier are priced after all (closed
// form) and join the ranking's tail (`ranked` from `first_unsimulated` on is in `better` order). A
// plan is on the frontier when it is faster per token than every plan that needs less memory; an
// unpriced plan whose bound is no faster than a priced plan with strictly less peak memory is not,
// and leaving it out changes no other plan's place (a plan it would shadow, the cheaper plan
// shadows too). Priced plans only set the bar: a higher bar prices more, never fewer.
template <class Better>
void reprice_pareto_candidates(const SearchRequest& req, std::vector<Candidate>& ranked, std::vector<Candidate>& unpriced,
                               size_t first_unsimulated, Better better) {
  if (unpriced.empty()) return;
  std::vector<std::pair<double, double>> priced;  // (peak bytes, seconds per token)
  priced.reserve(ranked.size());
  for (const Candidate& c : ranked) priced.emplace_back(c.peak_bytes, c.seconds_per_token());
  std::sort(priced.begin(), priced.end());
  std::stable_sort(unpriced.begin(), unpriced.end(), [](const Candidate& a, const Candidate& b) { return a.peak_bytes < b.peak_bytes; });
  std::vector<Candidate> kept;
  size_t i = 0;
  double bar = 1e300;  // the fewest seconds per token of the priced plans with less peak memory
  const size_t before = ranked.size();
  for (Candidate& c : unpriced) {
    for (; i < priced.size() && priced[i].first < c.peak_bytes; ++i) bar = std::min(bar, priced[i].second);
    if (1.0 / c.tokens_per_second_bound < bar) {
      c.time = pipeline_step_time(req.model, req.cluster, req.runtime, c.plan, req.seq, false);
      c.tokens_per_second_bound = 0;
      ranked.push_back(std::move(c));
    } else {
      kept.push_back(std::move(c));
    }
  }
  unpriced = std::move(kept);
  if (ranked.size() > before)
    stable_sort_moving_once(ranked, first_unsimulated, ranked.size(), better);
}

// When the global batch leaves no plan: dp = world / (tp * cp * pp) must divide the batch's
// sequences, so tp * cp * pp must be a multiple of r = world / gcd(world, sequences); tp and cp are
// powers of two in practice (tp divides a node, 2*cp the sequence), so an odd factor of r leaves only
// pipeline stages to take it. "" when r is a power of two (the batch is not the cause). Else says so,
// with the nearest batches that divide over one node's worth of tp * cp per replica and the nearest
// GPU counts (whole nodes) where r is a power of two.
std::string batch_advice(const SearchRequest& req) {
  const int64_t world = world_size(req.cluster);
  if (req.global_batch_tokens <= 0 || req.seq <= 0) return "";
  const int64_t seqs = req.global_batch_tokens / req.seq;
  auto pow2 = [](int64_t x) { return x > 0 && (x & (x - 1)) == 0; };
  const int64_t r = world / std::gcd(world, seqs);
  if (pow2(r)) return "";
  std::ostringstream os;
  os << "the global batch of " << seqs << " sequences (" << req.global_batch_tokens << " / " << req.seq << " tokens) does not divide over "
     << world << " GPUs: dp = GPUs / (tp*cp*pp) must divide " << seqs << ", so tp*cp*pp must be a multiple of " << r;
  const int64_t node = std::max<int64_t>(1, std::min(world, req.cluster.gpus_per_node));
  const int64_t dp = world / node;
  if (dp > 1 && seqs % dp != 0) {
    const int64_t lo = seqs / dp * dp, hi = lo + dp;
    os << "; with one node's tp*cp per replica (dp=" << dp << "), batches of " << (lo > 0 ? std::to_string(lo) + " or " : std::string())
       << hi << " sequences divide";
  }
  int64_t below = 0, above = 0;
  for (int64_t g = node; g < world; g += node)
    if (pow2(g / std::gcd(g, seqs))) below = g;
  for (int64_t g = world + node; g <= 64 * world; g += node)
    if (pow2(g / std::gcd(g, seqs))) {
      above = g;
      break;
    }
  if (below || above) {
    os << "; or plan on " << (below ? std::to_string(below) : std::string()) << (below && above ? " or " : "")
       << (above ? std::to_string(above) : std::string()) << " GPUs";
  }
  os << " (the stacks give every data-parallel rank whole sequences)";
  return os.str();
}

// Sets a plan's optimizer precision to `v`, leaving a field unset (StateDtype::runtime) where `v`
// is the runtime's own value, so that the plan's text names only what differs from the runtime; a
// field the user gave (req.fixed_fields) stays as given (lower_precision_variants kept its value).
void set_precision(Plan& p, const StateDtypes& v, const SearchRequest& req) {
  const StateDtypes own = runtime_state_dtypes(req.runtime);
  const json& fx = req.fixed_fields;
  if (!fx.contains("master")) p.master = v.master == own.master ? StateDtype::runtime : v.master;
  if (!fx.contains("grads")) p.grads = v.grads == own.grads ? StateDtype::runtime : v.grads;
  if (!fx.contains("moments")) p.moments = v.moments == own.moments ? StateDtype::runtime : v.moments;
}

// The runtime profile as a plan of the search with optimizer precision `v` runs on it
// (runtime_for_plan): pricing the unlabelled plans on it is pricing the labelled ones (set_precision)
// on req.runtime, without copying the profile for every plan.
RuntimeProfile variant_runtime(const SearchRequest& req, const StateDtypes& v) {
  Plan b = req.base;
  set_precision(b, v, req);
  return runtime_for_plan(req.runtime, b);
}

}  // namespace

std::vector<StateDtypes> lower_precision_variants(const SearchRequest& req) {
  const RuntimeCapabilities& caps = req.runtime.capabilities;
  std::vector<StateDtypes> out;
  if (!caps.declared) return out;  // a profile without capabilities states no optimizer precisions to try
  const StateDtypes own = runtime_state_dtypes(req.runtime);
  const json& fx = req.fixed_fields;
  // a field the user gave (--plan master=..., grads=..., moments=...) keeps its value
  auto values = [&](const char* field, StateDtype given, StateDtype mine, const std::vector<StateDtype>& allowed) {
    if (fx.contains(field)) return std::vector<StateDtype>{given == StateDtype::runtime ? mine : given};
    std::vector<StateDtype> v{mine};
    for (StateDtype x : allowed)
      if (x != mine && x != StateDtype::runtime) v.push_back(x);
    return v;
  };
  // the first pass's precision: the user's values, the runtime's own for the others
  auto resolved = [](StateDtype given, StateDtype mine) { return given == StateDtype::runtime ? mine : given; };
  const StateDtypes first{resolved(req.base.master, own.master), resolved(req.base.grads, own.grads),
                          resolved(req.base.moments, own.moments)};
  for (StateDtype m : values("master", req.base.master, own.master, caps.master))
    for (StateDtype g : values("grads", req.base.grads, own.grads, caps.grads))
      for (StateDtype o : values("moments", req.base.moments, own.moments, caps.moments)) {
        if (m == first.master && g == first.grads && o == first.moments) continue;  // priced in the first pass
        out.push_back(StateDtypes{m, g, o});
      }
  // most precise first: the most model-state bytes per parameter (runtime_for_plan's sizes); ties
  // keep the enumeration order (master, then grads, then moments: the runtime's own value of each first)
  auto state_bytes = [&](const StateDtypes& v) {
    Plan p = req.base;
    set_precision(p, v, req);
    const RuntimeProfile rt = runtime_for_plan(req.runtime, p);
    return rt.master_bytes + rt.grad_bytes + rt.optimizer_bytes;
  };
  std::stable_sort(out.begin(), out.end(), [&](const StateDtypes& a, const StateDtypes& b) { return state_bytes(a) > state_bytes(b); });
  return out;
}

std::vector<Plan> enumerate_plans(const SearchRequest& req) {
  std::vector<Plan> out;
  for_each_plan(req, true, [&](const Plan& p) { out.push_back(p); return true; });
  return out;
}

SearchResult search_plans(const SearchRequest& req, const std::function<bool(double)>& progress) {
  auto t0 = std::chrono::steady_clock::now();
  SearchResult r;
  // pass 1: count (for progress), pass 2: evaluate
  int64_t total = 0;
  for_each_plan(req, true, [&](const Plan&) { ++total; return true; });
  // the attention work per layout: everything attention_work reads that the plans of the search vary
  // (the variable-length strategy too: its calls, cp_varlen cycle / split:k); per rank for the
  // closed form, per ring step for the simulated finalists
  using LayoutKey = std::tuple<int64_t, int, int, int64_t, int64_t, int64_t, int, int64_t>;
  auto layout_key = [&](const Plan& p) {
    return LayoutKey{p.cp, static_cast<int>(p.cp_comm), static_cast<int>(p.cp_layout), ulysses_degree(p), p.dp, padded_seq(p, req.seq),
                     static_cast<int>(p.cp_varlen.kind), p.cp_varlen.split};
  };
  std::map<LayoutKey, AttentionWork> attention_cache, step_attention_cache;
  double best_ratio = 1e300;
  std::vector<Candidate> fitting;
  // Pruning pipeline plans (req.prune_pipeline): the tokens/s of the best `keep` plans priced so
  // far (a min-heap); a pipeline plan whose bound is below the worst of them cannot rank among the
  // first `keep` (the finalists and the top K with the neighbour its `why` names).
  const size_t keep = static_cast<size_t>(std::max({req.refine, req.top_k + 1, 1}));
  const bool prune = req.prune_pipeline && req.objective == Objective::time;
  std::priority_queue<double, std::vector<double>, std::greater<double>> best_tps;
  std::string first_invalid;  // when no plan is valid: the first one's reason
  // Optimizer precision (issue 21): every plan at the runtime's own first. Only when none of them
  // fits, a second pass (`lower`) prices each plan at the most precise of the lower precisions the
  // runtime allows that fits (lower_precision_variants, most model-state bytes first); the least
  // bytes variant is tried first, and when it does not fit no other does (memory falls with the bytes).
  std::vector<StateDtypes> variants;
  std::vector<RuntimeProfile> variant_rts;  // variant_runtime of each
  bool lower = false;
  int64_t visited = 0;
  // the lower pass: sets p to the most precise variant that fits and returns its memory (the
  // least-bytes variant's, not fitting, when none fits)
  auto most_precise_fitting = [&](Plan& p) {
    MemoryPrediction m = predict_memory(req.model, req.cluster, variant_rts.back(), p, req.seq);
    if (!m.fits()) return m;
    for (size_t i = 0; i + 1 < variants.size(); ++i) {
      MemoryPrediction mq = predict_memory(req.model, req.cluster, variant_rts[i], p, req.seq);
      if (mq.fits()) {
        set_precision(p, variants[i], req);
        return mq;
      }
    }
    set_precision(p, variants.back(), req);
    return m;
  };
  auto visit = [&](const Plan& plan) {
    ++visited;
    if (!lower) ++r.enumerated;
    if (progress && (visited & 4095) == 0 && !progress(static_cast<double>(visited) / static_cast<double>(total))) {
      r.cancelled = true;
      return false;
    }
    Plan p = plan;
    if (!plan_valid(p, req.model, req.cluster, req.seq)) {  // no text built for the plans refused
      if (first_invalid.empty()) first_invalid = refusal(plan, req.model, req.cluster, req.seq);  // the reason, of the first one only
      // a layout that does not divide the sequence: pad=1 (--plan) would pad it (the search pads only when told)
      if (!lower && !p.pad && req.seq > 0 && req.seq % seq_granule(p) != 0) ++r.not_dividing;
      return true;
    }
    if (!lower) ++r.valid;
    const MemoryPrediction mem = lower ? most_precise_fitting(p) : predict_memory(req.model, req.cluster, req.runtime, p, req.seq);
    if (lower && !mem.fits()) return true;
    Candidate c;
    c.plan = p;
    c.peak_bytes = mem.peak.total();
    c.capacity_bytes = mem.device_capacity_bytes;
    c.host_bytes_per_node = mem.host_total_bytes_per_node;
    c.fits = mem.fits();
    if (!c.fits) {
      if (lower) return true;  // unreachable (a fitting variant was chosen); the closest plan is the first pass's
      double ratio = std::max(c.peak_bytes / c.capacity_bytes, mem.host_total_bytes_per_node / std::max(1.0, mem.host_capacity_bytes_per_node));
      if (ratio < best_ratio) { best_ratio = ratio; r.closest = c; }
      return true;
    }
    ++r.fitting;
    {  // time is priced for every fitting plan (the memory objective still breaks ties by it)
      const LayoutKey key = layout_key(p);
      auto it = attention_cache.find(key);
      if (it == attention_cache.end()) {
        AttentionWork w = attention_work(p, req.seq, false);
        bool equal = true;
        for (auto& v : w.pairs) equal = equal && std::abs(v[0] - w.pairs[0][0]) <= 1e-9 * std::max(1.0, w.pairs[0][0]);
        if (equal && w.calls.empty()) w.pairs.resize(1);  // every rank alike: price one
        it = attention_cache.emplace(key, std::move(w)).first;
      }
      if (prune && p.pp > 1 && best_tps.size() >= keep) {
        // tokens per step as step_costs counts them; 1e-9: the bound and the priced time are summed
        // in different orders
        const double tokens = static_cast<double>(req.seq) * static_cast<double>(p.mbs * p.ga * std::max<int64_t>(1, p.dp));
        const double lb = pipeline_step_lower_bound_s(req.model, req.cluster, req.runtime, p, req.seq, &it->second);
        if (lb > 0 && tokens / lb < best_tps.top() * (1.0 - 1e-9)) {
          c.tokens_per_second_bound = tokens / lb;
          r.unpriced.push_back(std::move(c));
          return true;
        }
      }
      c.time = p.pp > 1 ? pipeline_step_time(req.model, req.cluster, req.runtime, p, req.seq, false, &it->second)
                        : estimate_step(step_costs(req.model, req.cluster, req.runtime, p, req.seq, false, &it->second));
      best_tps.push(c.time.tokens_per_second);
      if (best_tps.size() > keep) best_tps.pop();
    }
    fitting.push_back(std::move(c));
    return true;
  };
  for_each_plan(req, true, visit);
  if (r.fitting == 0 && !r.cancelled) variants = lower_precision_variants(req);
  for (const StateDtypes& v : variants) variant_rts.push_back(variant_runtime(req, v));
  if (!variants.empty()) {
    lower = true;
    total *= 2;
    for_each_plan(req, true, visit);
    r.lower_precision = r.fitting > 0;
  }
  auto better = [&](const Candidate& a, const Candidate& b) {
    if (req.objective == Objective::memory) {
      if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
      return a.time.step_seconds < b.time.step_seconds;
    }
    // time per token: step time alone would favour plans that process fewer sequences per step
    if (a.time.tokens_per_second != b.time.tokens_per_second) return a.time.tokens_per_second > b.time.tokens_per_second;
    return a.peak_bytes < b.peak_bytes;
  };
  stable_sort_moving_once(fitting, 0, fitting.size(), better);
  // refine the finalists with the event simulator
  // The first kAlwaysSimulated finalists are simulated whatever they cost; beyond them only plans
  // whose ring attention the sweep does quickly (at most kCheapRingSteps simulated (rank, ring step)
  // pairs per layer: a plain ring of up to 128 unequal ranks, any ring of alike ranks), so that many
  // finalists cost what 20 used to and a space of large plain rings (seconds each) stays bounded.
  // Deterministic: the rule reads the plan's costs, not the clock.
  constexpr size_t kAlwaysSimulated = 20;
  constexpr int64_t kCheapRingSteps = 128 * 128;
  const size_t nref = std::min(fitting.size(), static_cast<size_t>(std::max(0, req.refine)));
  std::vector<Candidate*> simulated;
  for (size_t i = 0; i < nref && !r.cancelled; ++i) {
    Candidate& c = fitting[i];
    if (c.plan.pp > 1) {  // stage by stage, then the exact schedule (pipeline_time.hpp), as predict()
      c.time = pipeline_step_time(req.model, req.cluster, req.runtime, c.plan, req.seq, true);
      c.simulated = true;
      ++r.simulated;
      continue;
    }
    const LayoutKey layout = layout_key(c.plan);
    auto work = step_attention_cache.find(layout);
    if (work == step_attention_cache.end()) work = step_attention_cache.emplace(layout, attention_work(c.plan, req.seq, true)).first;
    const StepCosts k = step_costs(req.model, req.cluster, req.runtime, c.plan, req.seq, true, &work->second);
    if (i >= kAlwaysSimulated && ring_steps_per_layer(k) > kCheapRingSteps) continue;
    // only the step time is read: the streaming sweep without recording the tasks (issue 15)
    SimResult sim = simulate_step(k, c.plan, SimRecord::none);
    c.time = sim.time;
    add_step_overhead(k, c.time);  // as predict() does: the simulator leaves the runtime's fixed overhead out
    c.simulated = true;
    ++r.simulated;
  }
  // simulated finalists first (re-ranked by their simulated time), then the rest as they were
  std::stable_partition(fitting.begin(), fitting.begin() + static_cast<std::ptrdiff_t>(nref), [](const Candidate& c) { return c.simulated; });
  std::stable_sort(fitting.begin(), fitting.begin() + static_cast<std::ptrdiff_t>(r.simulated), better);
  reprice_pareto_candidates(req, fitting, r.unpriced, static_cast<size_t>(r.simulated), better);
  // Pareto frontier: by peak memory, keep plans faster than every plan that needs less
  std::vector<const Candidate*> by_mem(fitting.size());  // stable-sorted pointers: the order of sorted copies, nothing copied
  for (size_t i = 0; i < fitting.size(); ++i) by_mem[i] = &fitting[i];
  std::stable_sort(by_mem.begin(), by_mem.end(), [](const Candidate* a, const Candidate* b) {
    if (a->peak_bytes != b->peak_bytes) return a->peak_bytes < b->peak_bytes;
    return a->time.step_seconds < b->time.step_seconds;
  });
  double best_t = 1e300;
  for (const Candidate* c : by_mem)
    if (c->seconds_per_token() < best_t) {
      best_t = c->seconds_per_token();
      r.pareto.push_back(*c);
    }
  for (size_t i = 0; i < fitting.size() && i < static_cast<size_t>(std::max(1, req.top_k)); ++i)
    fitting[i].why = explain(fitting[i], i + 1 < fitting.size() ? &fitting[i + 1] : nullptr, req.objective) +
                     explain_cp(fitting, i);
  r.ranked = std::move(fitting);
  if (r.ranked.empty() && !r.cancelled) {
    std::ostringstream os;
    if (r.valid == 0 && !batch_advice(req).empty()) {
      os << batch_advice(req);
      if (r.not_dividing > 0) os << "; or --plan pad=1, which pads the sequence for the layouts that do not divide it";
    } else if (r.valid == 0) {
      os << "no plan is valid for " << req.model.name << " at " << req.seq << " tokens on " << world_size(req.cluster) << " GPUs";
      if (!first_invalid.empty()) os << "; e.g. " << first_invalid;
      if (r.not_dividing > 0) os << "; " << r.not_dividing << " plans' layouts do not divide the sequence: --plan pad=1 pads it and prices the padding";
    } else {
      const double gib = 1024.0 * 1024 * 1024;
      os << "no plan fits. Tightest constraint: device memory; the closest plan (" << plan_to_string(r.closest.plan) << ") needs "
         << std::fixed;
      os.precision(1);
      os << r.closest.peak_bytes / gib << " GiB of " << r.closest.capacity_bytes / gib << " GiB per GPU ("
         << (r.closest.peak_bytes / r.closest.capacity_bytes) << "x).";
    }
    r.no_fit_reason = os.str();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

json fixed_plan_fields(const std::string& text, const std::string& where) {
  json fixed = json::object();
  const json defaults = plan_to_json(Plan{});
  // values from the whole text (a key's value can depend on another: ulysses=2 with cp_kind=usp)
  const json whole = plan_to_json(parse_plan(text, where));
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    const std::string key = item.substr(0, item.find('='));
    if (whole.contains(key)) {
      fixed[key] = whole[key];
      continue;
    }
    // a shorthand (cp_kind, mask's documents): the fields it moves from the defaults on its own
    json one;
    try {
      one = plan_to_json(parse_plan(item, where));
    } catch (const InputError&) {
      continue;  // valid only with the other keys: the whole text's fields above carry it
    }
    for (auto& [f, v] : one.items())
      if ((!defaults.contains(f) || defaults[f] != v) && whole.contains(f)) fixed[f] = whole[f];
  }
  return fixed;
}

bool keeps_fixed_fields(const Plan& p, const json& fixed) {
  if (fixed.empty()) return true;
  const json j = plan_to_json(p);
  for (auto& [f, v] : fixed.items())
    if (!j.contains(f) || j[f] != v) return false;
  return true;
}

void check_constraints(const SearchRequest& req, const std::string& where) {
  const json& fx = req.fixed_fields;
  if (fx.empty()) return;
  const int64_t world = world_size(req.cluster);
  auto any_plan = [](const SearchRequest& r, std::string* invalid) {
    bool any = false, valid = false;
    for_each_plan(r, true, [&](const Plan& plan) {
      any = true;
      if (r.seq <= 0) return false;
      Plan p = plan;
      if (plan_valid(p, r.model, r.cluster, r.seq)) valid = true;
      else if (invalid && invalid->empty()) *invalid = refusal(plan, r.model, r.cluster, r.seq);
      return !valid;
    });
    return r.seq <= 0 ? any : valid;
  };
  std::string invalid;
  if (any_plan(req, &invalid)) return;
  // which key alone leaves no plan: that key, with the values the search can give it
  for (auto& item : fx.items()) {
    const std::string f = item.key();  // named copies: lambdas below capture them
    const json v = item.value();
    SearchRequest one = req;
    one.fixed_fields = json{{f, v}};
    std::string dummy;
    if (any_plan(one, &dummy)) continue;
    if (req.runtime.capabilities.declared) {  // plans with the key that the runtime cannot run: say why
      SearchRequest any = one;
      any.runtime.capabilities = RuntimeCapabilities{};
      std::string why;
      for_each_plan(any, true, [&](const Plan& p) {
        if (runtime_runs(req.runtime.capabilities, p)) return true;
        why = missing_capability(req.runtime.capabilities, req.runtime.name, p);
        return false;
      });
      if (!why.empty()) throw InputError(where, f, why + "; choose another runtime (--runtime) or drop the key");
    }
    SearchRequest free = req;
    free.fixed_fields = json::object();
    std::set<std::string> values;
    for_each_plan(free, true, [&](const Plan& p) {
      const json j = plan_to_json(p);
      if (j.contains(f)) values.insert(j[f].is_string() ? j[f].get<std::string>() : j[f].dump());
      return values.size() < 64;
    });
    std::string list;
    for (const std::string& x : values) list += (list.empty() ? "" : ", ") + x;
    const std::string given = v.is_string() ? v.get<std::string>() : v.dump();
    throw InputError(where, f,
                     f + "=" + given + ": no plan " + (req.seq > 0 ? "valid at " + std::to_string(req.seq) + " tokens " : "") + "on " +
                         std::to_string(world) + " GPUs (" + req.model.name + ", the search's other options) has it" +
                         (list.empty() ? "" : "; the search's plans have " + f + " = " + list) +
                         (invalid.empty() ? "" : "; e.g. " + invalid));
  }
  std::string keys;
  for (auto& [f, v] : fx.items()) keys += (keys.empty() ? "" : ",") + f + "=" + (v.is_string() ? v.get<std::string>() : v.dump());
  throw InputError(where, "", "no plan " + (req.seq > 0 ? "valid at " + std::to_string(req.seq) + " tokens " : std::string()) + "on " +
                                  std::to_string(world) + " GPUs keeps all of " + keys + " together" +
                                  (invalid.empty() ? "" : "; e.g. " + invalid));
}

int64_t max_trainable_seq_any(const SearchRequest& req, int64_t hi, Plan* best, int64_t at_least) {
  int64_t best_seq = std::max<int64_t>(0, at_least);  // only plans that beat it are bisected
  for_each_plan(req, false, [&](const Plan& plan) {
    if (!keeps_fixed_fields(plan, req.fixed_fields)) return true;  // a key the user gave, changed
    Plan p = plan;
    int64_t g = seq_granule(p);
    int64_t probe = std::max<int64_t>(g, (std::min<int64_t>(hi, 1 << 20) / g) * g);
    if (!plan_valid(p, req.model, req.cluster, probe)) return true;
    // only plans that could beat the best so far are bisected
    if (best_seq > 0) {
      int64_t at = (best_seq / g + 1) * g;
      if (at > hi || !predict_memory(req.model, req.cluster, req.runtime, p, at).fits()) return true;
    }
    int64_t s = max_trainable_seq(req.model, req.cluster, req.runtime, p, hi);
    if (s > best_seq) {
      best_seq = s;
      if (best) *best = p;
    }
    return true;
  });
  return best_seq;
}

int64_t max_trainable_seq_lower_precision(const SearchRequest& req, int64_t hi, Plan* best, int64_t at_least, const Plan* seed) {
  const std::vector<StateDtypes> variants = lower_precision_variants(req);
  if (variants.empty()) return 0;
  // every plan at the least model-state bytes the runtime allows (the user's fields kept), priced on
  // the runtime as such plans run on it (variant_runtime); the answer's plan is labelled after
  SearchRequest low = req;
  low.runtime = variant_runtime(req, variants.back());
  // the seed (maxseq: the plan that answered at the runtime's own precision) first: a high floor
  // early, so that few plans are bisected after it
  int64_t seeded = 0;
  if (seed && keeps_fixed_fields(*seed, req.fixed_fields)) seeded = max_trainable_seq(req.model, req.cluster, low.runtime, *seed, hi);
  const int64_t floor = std::max(at_least, seeded);
  Plan found;
  const int64_t out = max_trainable_seq_any(low, hi, &found, floor);
  if (out == floor && seeded > at_least) found = *seed;  // no plan beat the seed: it is the answer
  if (best && out > at_least) {
    *best = found;
    set_precision(*best, variants.back(), req);
  }
  return out;
}

}  // namespace ctx

namespace ctx {

ClusterSpec resized_cluster(const ClusterSpec& c, int64_t gpus) {
  ClusterSpec r = c;
  // a one-GPU "cluster" written as 1xh100 grows into whole nodes of the GPU's default size
  const int64_t node = c.nodes == 1 && c.gpus_per_node == 1 ? std::max<int64_t>(1, c.gpu.default_gpus_per_node) : c.gpus_per_node;
  r.gpus_per_node = std::min(gpus, node);
  r.nodes = (gpus + r.gpus_per_node - 1) / r.gpus_per_node;
  r.name = std::to_string(r.nodes) + "x" + std::to_string(r.gpus_per_node) + "x" + c.gpu.name;
  return r;
}

std::string no_fit_advice(const SearchRequest& req) {
  std::ostringstream os;
  Plan best;
  int64_t here = max_trainable_seq_any(req, req.seq, &best);
  if (here > 0) os << "A shorter sequence fits here: up to " << here << " tokens (" << plan_to_string(best) << "). ";
  else os << "Not even the shortest sequence fits on " << world_size(req.cluster) << (world_size(req.cluster) == 1 ? " GPU. " : " GPUs. ");
  for (int64_t mult = 2; mult <= 64; mult *= 2) {
    SearchRequest more = req;
    more.cluster = resized_cluster(req.cluster, world_size(req.cluster) * mult);
    Plan p;
    if (max_trainable_seq_any(more, req.seq, &p) >= req.seq) {
      os << "More GPUs: " << world_size(more.cluster) << " (" << more.cluster.nodes << " nodes) fit it with " << plan_to_string(p) << ". ";
      break;
    }
    if (mult == 64) os << "Even 64x the GPUs do not fit it (the model states or the per-rank activations do not shard further). ";
  }
  if (!req.allow_offload) {
    SearchRequest off = req;
    off.allow_offload = true;
    Plan p;
    if (max_trainable_seq_any(off, req.seq, &p) >= req.seq) os << "Allowing offload fits it: " << plan_to_string(p) << ". ";
  }
  return os.str();
}

}  // namespace ctx
