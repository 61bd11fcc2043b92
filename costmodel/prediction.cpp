#include "costmodel/prediction.hpp"

#include "costmodel/pipeline_stages.hpp"

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
  p.pad_tokens = padded_seq(plan, seq) - seq;
  p.world = world_size(c);
  p.plan = plan;
  p.warnings = check.warnings;
  p.memory = predict_memory(m, c, rt, plan, seq);
  // at the plan's dtypes (runtime_for_plan: grads=bf16 halves the gradient reduction, as step_costs prices it)
  p.zero_comm = zero_comm_terms(m, plan, local_shapes(m, plan, seq + p.pad_tokens), runtime_for_plan(rt, plan), c.gpus_per_node);
  p.time_band = error_band(rt, c.gpu.name);  // from the runtime's residuals on this GPU (error_band.hpp)
  StepCosts costs = step_costs(m, c, rt, plan, seq, true);
  p.attention = costs.attention_kernel;
  if (plan.pp > 1) {  // pipeline parallel: stage by stage, then the schedule (pipeline_time.hpp)
    PipelineStepDetail detail;
    p.time = pipeline_step_time(m, c, rt, plan, seq, true, nullptr, &detail);
    p.time_closed_form = pipeline_step_time(m, c, rt, plan, seq, false);
    p.pipeline = pipeline_to_json(plan, m, detail);
    p.pipeline["memory_peak_stage"] = p.memory.peak_stage;
    p.sim_stats.tasks = detail.schedule.tasks;
    if (sim) {
      *sim = SimResult{};
      sim->time = p.time;
      sim->stats = p.sim_stats;
    }
    return p;
  }
  p.time_closed_form = estimate_step(costs);
  // the task graph is recorded only when the caller asks for the result and its tasks (trace,
  // timeline, tests)
  SimResult r = simulate_step(costs, plan, sim ? record : SimRecord::none);
  p.time = r.time;
  add_step_overhead(costs, p.time);  // the simulator times the step without the runtime's fixed overhead
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
            {"optimizer", t.breakdown.optimizer},
            {"overhead", t.breakdown.overhead}}},
          {"tokens_per_second", t.tokens_per_second},
          {"mfu", t.mfu},
          {"model_tflops_per_gpu", t.model_tflops_per_gpu},
          {"hardware_tflops_per_gpu", t.hardware_tflops_per_gpu}};
}

json pipeline_to_json(const Plan& p, const ModelSpec& m, const PipelineStepDetail& d) {
  json stages = json::array();
  for (int64_t s = 0; s < d.times.stages; ++s) {
    const PipelineStage st = pipeline_stage(m, p, s);
    const size_t i = static_cast<size_t>(s);
    stages.push_back({{"stage", s},
                      {"layers", st.layers},
                      {"first_layer", st.first_layer},
                      {"embedding", st.first},
                      {"head_and_loss", st.last},
                      {"in_flight_chunks", st.in_flight_chunks},
                      {"busy_seconds", i < d.schedule.busy_s.size() ? d.schedule.busy_s[i] : 0.0},
                      {"last_backward_end_seconds", i < d.schedule.end_s.size() ? d.schedule.end_s[i] : 0.0},
                      {"tail_seconds", i < d.tail_s.size() ? d.tail_s[i] : 0.0}});
  }
  json chunks = json::array();
  const std::vector<int64_t> chunk_layers = pipeline_chunk_layers(m.layers, p);
  for (size_t v = 0; v < d.times.fwd_s.size(); ++v)
    chunks.push_back({{"virtual_stage", v}, {"layers", chunk_layers[v]}, {"forward_seconds", d.times.fwd_s[v]}, {"backward_seconds", d.times.bwd_s[v]}});
  json sends = json::array();
  for (size_t v = 0; v < d.times.p2p_fwd_s.size(); ++v)
    sends.push_back({{"from_virtual_stage", v}, {"seconds", d.times.p2p_fwd_s[v]}, {"inter_node", static_cast<bool>(d.p2p_inter_node[v])}});
  return {{"schedule", d.times.chunks > 1 ? "interleaved-1f1b" : "1f1b"},
          {"pp", d.times.stages},
          {"vpp", d.times.chunks},
          {"micro_batches", d.times.micro_batches},
          {"schedule_seconds", d.schedule.step_s},
          {"bubble_seconds", d.schedule.bubble_s},
          {"critical_stage", d.critical_stage},
          {"p2p_bytes", d.p2p_bytes},
          {"stages", stages},
          {"chunks_per_micro_batch", chunks},
          {"sends", sends}};
}

json error_band_to_json(const ErrorBand& b, double step_seconds) {
  json j = {{"method", "empirical p10/p90 of ln(measured/predicted) step time (docs/CALIBRATION.md)"},
            {"residuals", b.residuals}, {"basis", b.basis}};
  if (b.residuals == 0) return j;
  j["p10_step_seconds"] = b.low(step_seconds);
  j["p90_step_seconds"] = b.high(step_seconds);
  j["p10_ratio"] = b.p10_ratio;
  j["p90_ratio"] = b.p90_ratio;
  j["few_residuals"] = b.few;
  return j;
}

json prediction_to_json(const Prediction& p) {
  const MemoryPrediction& mp = p.memory;
  json phases = json::object();
  for (int i = 0; i < kPhases; ++i)
    phases[to_string(static_cast<Phase>(i))] = {{"peak_bytes", mp.phase_peak[i].total()},
                                                {"by_category", snapshot_json(mp.phase_peak[i])}};
  json host = json::object();
  for (int i = 0; i < kHostCategories; ++i) host[to_string(static_cast<HostMem>(i))] = mp.host_bytes_per_node[i];
  // the stack's own buffers (framework_memory.hpp), inside the device and host `runtime` categories
  json framework = json::array();
  for (int i = 0; i < mp.framework.count; ++i) {
    const FrameworkTerm& t = mp.framework.terms[i];
    framework.push_back({{"name", t.name}, {"category", "runtime"}, {"where", t.host ? "host" : "device"},
                         {"bytes_per_rank", t.bytes}, {"source", t.source}});
  }
  json j;
  j["schema"] = "ctxplan.prediction/1";
  j["model"] = p.model;
  j["cluster"] = p.cluster;
  j["gpu"] = p.gpu;
  j["runtime"] = p.runtime;
  j["attention"] = p.attention;
  j["seq"] = p.seq;
  j["pad_tokens"] = p.pad_tokens;  // pad=1: memory and time priced at seq + pad_tokens, tokens_per_second counts seq
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
                 {"framework_terms", framework},
                 {"fits_device", mp.fits_device},
                 {"fits_host", mp.fits_host},
                 {"tensor_elements", mp.tensor_elements},
                 {"max_tensor_elements", mp.max_tensor_elements},
                 {"fits_index", mp.fits_index}};
  j["time"] = step_time_to_json(p.time);
  j["time"]["closed_form_step_seconds"] = p.time_closed_form.step_seconds;
  j["time"]["band"] = error_band_to_json(p.time_band, p.time.step_seconds);
  j["fits"] = mp.fits();
  j["warnings"] = p.warnings;
  if (!p.pipeline.is_null()) j["pipeline"] = p.pipeline;
  json zc = json::array();
  double inter = 0;
  for (const ZeroCommTerm& t : p.zero_comm) {
    zc.push_back({{"name", t.name}, {"collective", to_string(t.coll)},
                  {"group", t.group == Group::zero_shard ? "zero_shard" : t.group == Group::zero_replicate ? "zero_replicate" : "zero"},
                  {"group_size", t.where.size}, {"nodes_spanned", t.where.nodes}, {"message_bytes", t.message_bytes},
                  {"calls_per_step", t.calls_per_step}, {"inter_node_bytes_per_rank", t.inter_node_bytes_per_rank}});
    inter += t.inter_node_bytes_per_rank;
  }
  j["data_parallel_comm"] = {{"zero_shard", zero_shard_degree(p.plan)}, {"zero_replicate", zero_replicate_degree(p.plan)},
                             {"terms", zc}, {"inter_node_bytes_per_rank", inter}};
  return j;
}

}  // namespace ctx
