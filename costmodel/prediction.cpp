#include "costmodel/prediction.hpp"

namespace ctx {

Prediction predict(const ModelSpec& m, const ClusterSpec& c, const RuntimeProfile& rt, Plan plan, int64_t seq,
                   SimResult* sim, SimRecord record) {
  PlanCheck check = check_plan(plan, m, c, seq);
  if (!check.ok()) throw InputError("--plan", "", "invalid plan for " + m.name + " on " + c.name + " at " +
                                                     std::to_string(seq) + " tokens: " + check.message());
  Prediction p;
  p.model = m.name;
  p.cluster = c.name;
  p.gpu = c.gpu.name;
  p.runtime = rt.name;
  p.seq = seq;
  p.world = world_size(c);
  p.plan = plan;
  p.warnings = check.warnings;
  p.memory = predict_memory(m, c, rt, plan, seq);
  StepCosts costs = step_costs(m, c, rt, plan, seq, true);
  p.time_closed_form = estimate_step(costs);
  // the task graph is recorded only when the caller asks for the result and its tasks (trace,
  // timeline, tests)
  SimResult r = simulate_step(costs, plan, sim ? record : SimRecord::none);
  p.time = r.time;
  p.sim_stats = r.stats;
  if (sim) *sim = std::move(r);
  return p;
}

static json snapshot_json(const MemorySnapshot& s) {
  json j = json::object();
  for (int i = 0; i < kMemCategories; ++i) j[to_string(static_cast<Mem>(i))] = s.bytes[i];
  return j;
}

json step_time_to_json(const StepTime& t) {
  json phases = json::object();
  for (int i = 0; i < static_cast<int>(TimePhase::count); ++i) phases[to_string(static_cast<TimePhase>(i))] = t.phase_seconds[i];
  return {{"method", t.method},
          {"step_seconds", t.step_seconds},
          {"phases_seconds", phases},
          {"breakdown_seconds",
           {{"compute", t.breakdown.compute},
            {"exposed_comm", t.breakdown.exposed_comm},
            {"offload_stall", t.breakdown.offload_stall},
            {"imbalance_bubble", t.breakdown.imbalance},
            {"optimizer", t.breakdown.optimizer}}},
          {"tokens_per_second", t.tokens_per_second},
          {"mfu", t.mfu},
          {"model_tflops_per_gpu", t.model_tflops_per_gpu},
          {"hardware_tflops_per_gpu", t.hardware_tflops_per_gpu}};
}

json prediction_to_json(const Prediction& p) {
  const MemoryPrediction& mp = p.memory;
  json phases = json::object();
  for (int i = 0; i < kPhases; ++i)
    phases[to_string(static_cast<Phase>(i))] = {{"peak_bytes", mp.phase_peak[i].total()},
                                                {"by_category", snapshot_json(mp.phase_peak[i])}};
  json host = json::object();
  for (int i = 0; i < kHostCategories; ++i) host[to_string(static_cast<HostMem>(i))] = mp.host_bytes_per_node[i];
  json j;
  j["schema"] = "ctxplan.prediction/1";
  j["model"] = p.model;
  j["cluster"] = p.cluster;
  j["gpu"] = p.gpu;
  j["runtime"] = p.runtime;
  j["seq"] = p.seq;
  j["world"] = p.world;
  j["plan"] = plan_to_json(p.plan);
  j["plan_string"] = plan_to_string(p.plan);
  j["memory"] = {{"peak_bytes", mp.peak.total()},
                 {"peak_phase", to_string(mp.peak_phase)},
                 {"peak_layer", mp.peak_layer},
                 {"capacity_bytes", mp.device_capacity_bytes},
                 {"headroom_bytes", mp.headroom_bytes()},
                 {"by_category", snapshot_json(mp.peak)},
                 {"phases", phases},
                 {"host_per_node",
                  {{"total_bytes", mp.host_total_bytes_per_node},
                   {"capacity_bytes", mp.host_capacity_bytes_per_node},
                   {"ranks_per_node", mp.ranks_per_node},
                   {"by_category", host}}},
                 {"fits_device", mp.fits_device},
                 {"fits_host", mp.fits_host}};
  j["time"] = step_time_to_json(p.time);
  j["time"]["closed_form_step_seconds"] = p.time_closed_form.step_seconds;
  j["fits"] = mp.fits();
  j["warnings"] = p.warnings;
  return j;
}

}  // namespace ctx
