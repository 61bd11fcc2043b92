#include "executor/report.hpp"

#include <numeric>

namespace ctx::exec {
namespace {
constexpr int kSnap = kMemCategories;
// one rank's numbers, flat: peak snapshot, peak phase, per-phase snapshots, host peaks, phase seconds,
// attention work (kAttention entries)
constexpr int kAttention = 4;  // pairs counted by the kernel, layer forwards, query heads in attention, of the TP rank
constexpr int kFields = kSnap + 1 + kPhases * kSnap + kHostCategories + kPhases + kAttention;
constexpr int kAttention0 = kFields - kAttention;

// The attention work this rank's kernels counted (Backend::attention_forward_pairs): query-key
// pairs the mask keeps, each evaluated for `attention_query_heads` heads (all of the TP rank's query
// heads, or 1/u of them after a Ulysses all-to-all), summed over every layer forward (recomputed
// ones included) and divided by their number. The cost model's per-rank work
// (costmodel/attention_work.hpp, attention_pairs_per_rank) is in pairs times the share of the TP
// rank's heads: attention_pairs_per_layer_forward * attention_query_heads /
// attention_query_heads_per_tp_rank. null where the backend does not count (CUDA).
void add_attention(json& j, const double* f) {
  const double pairs = f[kAttention0], forwards = f[kAttention0 + 1];
  const bool counted = pairs >= 0 && forwards > 0;
  auto whole = [](double x) { return static_cast<int64_t>(x); };  // counts, exact in a double below 2^53
  j["attention_pairs_total"] = counted ? json(whole(pairs)) : json(nullptr);
  j["attention_layer_forwards"] = whole(forwards);
  j["attention_pairs_per_layer_forward"] = counted ? json(pairs / forwards) : json(nullptr);
  j["attention_query_heads"] = whole(f[kAttention0 + 2]);
  j["attention_query_heads_per_tp_rank"] = whole(f[kAttention0 + 3]);
}

json snapshot(const double* b) {
  json j = json::object();
  for (int i = 0; i < kMemCategories; ++i) j[to_string(static_cast<Mem>(i))] = b[i];
  return j;
}
double total(const double* b) { return std::accumulate(b, b + kSnap, 0.0); }

json rank_json(const double* f, int64_t ranks_per_node, double seconds_div) {
  json phases = json::object();
  for (int p = 0; p < kPhases; ++p) {
    const double* s = f + kSnap + 1 + p * kSnap;
    phases[to_string(static_cast<Phase>(p))] = {{"peak_bytes", total(s)}, {"by_category", snapshot(s)}};
  }
  json host = json::object();
  double host_total = 0;
  for (int i = 0; i < kHostCategories; ++i) {
    double v = f[kSnap + 1 + kPhases * kSnap + i] * static_cast<double>(ranks_per_node);
    host[to_string(static_cast<HostMem>(i))] = v;
    host_total += v;
  }
  json time = json::object();
  double step = 0;
  for (int p = 0; p < kPhases; ++p) {
    double s = f[kSnap + 1 + kPhases * kSnap + kHostCategories + p] / seconds_div;
    time[to_string(static_cast<Phase>(p))] = s;
    step += s;
  }
  json j;
  j["memory"] = {{"peak_bytes", total(f)},
                 {"peak_phase", to_string(static_cast<Phase>(static_cast<int>(f[kSnap])))},
                 {"by_category", snapshot(f)},
                 {"phases", phases},
                 {"host_per_node", {{"total_bytes", host_total}, {"ranks_per_node", ranks_per_node}, {"by_category", host}}}};
  j["time"] = {{"step_seconds", step}, {"phases", time}};
  return j;
}
}  // namespace

json measurement_json(Trainer& t, Backend& be, const RunRecord& r) {
  ParallelContext& pc = t.context();
  const MemoryLedger& led = be.ledger();
  std::vector<double> all(static_cast<size_t>(pc.world * kFields), 0.0);
  double* f = all.data() + pc.rank * kFields;
  for (int i = 0; i < kSnap; ++i) f[i] = led.at_peak().bytes[i];
  f[kSnap] = static_cast<double>(static_cast<int>(led.peak_phase()));
  for (int p = 0; p < kPhases; ++p)
    for (int i = 0; i < kSnap; ++i) f[kSnap + 1 + p * kSnap + i] = led.phase_peak(static_cast<Phase>(p)).bytes[i];
  for (int i = 0; i < kHostCategories; ++i)
    f[kSnap + 1 + kPhases * kSnap + i] = static_cast<double>(led.host_peak(static_cast<HostMem>(i)));
  for (int p = 0; p < kPhases; ++p) f[kSnap + 1 + kPhases * kSnap + kHostCategories + p] = r.phase_seconds[p];
  be.synchronize();  // the pair count is stream-ordered
  f[kAttention0] = static_cast<double>(be.attention_forward_pairs());
  f[kAttention0 + 1] = static_cast<double>(t.model().attention().forward_calls());
  f[kAttention0 + 2] = static_cast<double>(t.layout().attn_q_heads);
  f[kAttention0 + 3] = static_cast<double>(t.layout().q_heads);
  pc.world_comm->host_allreduce_sum(all.data(), static_cast<int64_t>(all.size()));

  const double div = static_cast<double>(std::max<int64_t>(1, r.measured_steps));
  json ranks = json::array();
  int worst = 0;
  for (int64_t k = 0; k < pc.world; ++k) {
    json rj = rank_json(all.data() + k * kFields, pc.world, div);
    rj["rank"] = k;
    add_attention(rj, all.data() + k * kFields);
    ranks.push_back(rj);
    if (total(all.data() + k * kFields) > total(all.data() + worst * kFields)) worst = static_cast<int>(k);
  }
  json j;
  j["schema"] = "ctxplan.measurement/1";
  j["model"] = r.model;
  j["cluster"] = r.cluster;
  j["gpu"] = r.gpu;
  j["runtime"] = "ctxrun";
  j["backend"] = be.name();
  j["seq"] = r.seq;
  j["world"] = pc.world;
  j["plan"] = plan_to_json(r.plan);
  j["plan_string"] = plan_to_string(r.plan);
  json top = rank_json(all.data() + worst * kFields, pc.world, div);
  j["memory"] = top["memory"];
  j["memory"]["peak_rank"] = worst;
  j["time"] = top["time"];
  j["time"]["measured_steps"] = r.measured_steps;
  double mean_step = 0;
  for (size_t i = 1; i < r.step_seconds.size(); ++i) mean_step += r.step_seconds[i];
  if (r.step_seconds.size() > 1) mean_step /= static_cast<double>(r.step_seconds.size() - 1);
  else if (!r.step_seconds.empty()) mean_step = r.step_seconds[0];
  j["time"]["wall_step_seconds"] = mean_step;
  j["time"]["tokens_per_second"] = mean_step > 0 ? static_cast<double>(r.tokens_per_step) / mean_step : 0.0;
  j["ranks"] = ranks;
  j["losses"] = r.losses;
  j["grad_norms"] = r.grad_norms;
  j["step_seconds"] = r.step_seconds;
  j["notes"] = {"bytes are what the accounting allocator handed out, by category, at the rank's peak instant",
                "time.phases are mean seconds per step; the first step is included (warm-up)",
                "ranks[].attention_pairs_per_layer_forward: query-key pairs the rank's attention kernel evaluated (counted by "
                "the CPU backend; null on others) per layer forward, each for attention_query_heads heads"};
  return j;
}

}  // namespace ctx::exec
