// `ctxplan predict`: one plan, its per-GPU memory by category at the timeline's peak, per-phase
// peaks, host memory per node, its simulated step time with the breakdown, and the verdict
// (exit 0 fits, 3 does not fit).
#include <iostream>

#include "costmodel/prediction.hpp"
#include "planner/commands.hpp"
#include "costmodel/exit_codes.hpp"
#include "planner/format.hpp"
#include "planner/job_args.hpp"

namespace ctx {
namespace {

struct PredictArgs {
  JobArgs job;
  std::string out;
  bool json = false;
};

std::string print_table(const Prediction& p) {
  const MemoryPrediction& m = p.memory;
  std::ostringstream os;
  os << "ctxplan predict: " << p.model << " on " << p.cluster << " (" << p.world << " x " << p.gpu << "), seq "
     << p.seq << " tokens, runtime " << p.runtime << " (attention " << p.attention << ")\n";
  os << "plan: " << plan_to_string(p.plan) << "\n";
  if (p.pad_tokens > 0)
    os << "padded: " << p.pad_tokens << " pad tokens per sequence, memory and time priced at " << p.seq + p.pad_tokens
       << " tokens; tokens/s counts the " << p.seq << " real ones\n";
  os << "\n";
  os << "Per-GPU memory at the peak (" << to_string(m.peak_phase);
  if (p.plan.pp > 1) os << ", pipeline stage " << m.peak_stage << " of " << p.plan.pp;  // the stage with the most memory binds
  if (m.peak_layer >= 0) os << ", layer " << m.peak_layer;
  os << "):\n";
  Table t;
  t.header = {"category", "GiB", "share"};
  double total = m.peak.total();
  for (int i = 0; i < kMemCategories; ++i) {
    double b = m.peak.bytes[i];
    if (b <= 0) continue;
    t.rows.push_back({to_string(static_cast<Mem>(i)), gib(b), fixed(100.0 * b / total, 1) + "%"});
  }
  t.rows.push_back({"total (peak)", gib(total), "100.0%"});
  t.rows.push_back({"usable capacity", gib(m.device_capacity_bytes), ""});
  t.rows.push_back({"headroom", gib(m.headroom_bytes()), fixed(100.0 * m.headroom_bytes() / m.device_capacity_bytes, 1) + "%"});
  os << t.render();
  const StepTime& st = p.time;
  os << "\nStep time (simulated): " << fixed(st.step_seconds, 3) << " s  |  " << fixed(st.tokens_per_second, 0)
     << " tokens/s  |  MFU " << fixed(100.0 * st.mfu, 1) << "%  |  " << fixed(st.model_tflops_per_gpu, 0)
     << " model TFLOP/s per GPU  (closed form: " << fixed(p.time_closed_form.step_seconds, 3) << " s)\n";
  if (p.time_band.residuals > 0)
    os << "  p10-p90 band: " << fixed(p.time_band.low(st.step_seconds), 3) << " - " << fixed(p.time_band.high(st.step_seconds), 3)
       << " s (" << p.time_band.basis << ")\n";
  else
    os << "  p10-p90 band: none (" << p.time_band.basis << ")\n";
  os << "  phases: forward " << fixed(st.phase_seconds[0], 3) << " s, backward " << fixed(st.phase_seconds[1], 3)
     << " s, optimizer " << fixed(st.phase_seconds[2], 3) << " s\n";
  os << "  where it goes: compute " << fixed(st.breakdown.compute, 3) << " s, exposed comm " << fixed(st.breakdown.exposed_comm, 3)
     << " s, offload stall " << fixed(st.breakdown.offload_stall, 3) << " s, imbalance " << fixed(st.breakdown.imbalance, 3)
     << " s, optimizer " << fixed(st.breakdown.optimizer, 3) << " s\n";
  if (!p.zero_comm.empty()) {
    os << "  data-parallel collectives per step (zero_shard " << zero_shard_degree(p.plan) << " x replicas "
       << zero_replicate_degree(p.plan) << "):";
    for (const ZeroCommTerm& t : p.zero_comm)
      os << "\n    " << t.name << ": " << fixed(t.calls_per_step, 0) << " x " << human_bytes(t.message_bytes) << " over "
         << t.where.size << " ranks on " << t.where.nodes << " node(s), " << human_bytes(t.inter_node_bytes_per_rank)
         << " inter-node per GPU";
    os << "\n";
  }
  os << "\nPeak of each phase (GiB): ";
  for (int i = 0; i < kPhases; ++i)
    os << (i ? " | " : "") << to_string(static_cast<Phase>(i)) << " " << gib(m.phase_peak[i].total());
  os << "\n\nHost memory per node (" << m.ranks_per_node << " ranks): " << gib(m.host_total_bytes_per_node) << " of "
     << gib(m.host_capacity_bytes_per_node) << " GiB";
  std::string parts;
  for (int i = 0; i < kHostCategories; ++i)
    if (m.host_bytes_per_node[i] > 0)
      parts += (parts.empty() ? "" : ", ") + std::string(to_string(static_cast<HostMem>(i))) + " " +
               gib(m.host_bytes_per_node[i]);
  if (!parts.empty()) os << " (" << parts << ")";
  os << "\n";
  if (m.framework.count > 0) {  // framework_memory.hpp: part of the device and host runtime categories
    os << "  framework buffers in runtime:";
    for (int i = 0; i < m.framework.count; ++i) {
      const FrameworkTerm& t = m.framework.terms[i];
      os << "\n    " << t.name << ": " << human_bytes(t.bytes) << " per rank on the " << (t.host ? "host" : "device")
         << (t.host ? " (x " + std::to_string(m.ranks_per_node) + " ranks per node)" : std::string()) << "  [" << t.source << "]";
    }
    os << "\n";
  }
  for (auto& w : p.warnings) os << "warning: " << w << "\n";
  os << "\n";
  if (m.fits()) {
    os << "FITS: peak " << gib(total) << " GiB of " << gib(m.device_capacity_bytes) << " GiB usable per GPU\n";
  } else {
    if (!m.fits_device)
      os << "DOES NOT FIT: peak " << gib(total) << " GiB exceeds the " << gib(m.device_capacity_bytes)
         << " GiB usable per GPU by " << gib(-m.headroom_bytes()) << " GiB\n";
    if (!m.fits_host)
      os << "DOES NOT FIT: host memory " << gib(m.host_total_bytes_per_node) << " GiB per node exceeds "
         << gib(m.host_capacity_bytes_per_node) << " GiB\n";
    if (!m.fits_index)
      os << "DOES NOT RUN: a [tokens, hidden] tensor of " << static_cast<int64_t>(m.tensor_elements)
         << " elements per GPU exceeds the " << static_cast<int64_t>(m.max_tensor_elements)
         << " its runtime's kernels index (constant tiled_loss_max_tensor_elements)\n";
  }
  return os.str();
}

}  // namespace

std::function<int()> add_predict_command(CLI::App& app, CommonOptions& common) {
  auto args = std::make_shared<PredictArgs>();
  add_job_options(app, args->job, true);
  app.add_flag("--json", args->json, "print the Prediction as JSON (schema ctxplan.prediction/1)");
  app.add_option("--out,-o", args->out, "also write the Prediction JSON to this file");
  app.footer(
      "Examples:\n"
      "  ctxplan predict\n"
      "  ctxplan predict --model Llama-3.1-70B --cluster 4x8xh100 --seq 1m --plan \"tp=8,cp=4,cp_kind=zigzag,zero=1,recompute=full\"\n"
      "  ctxplan predict --model ./config.json --cluster 8xh200 --seq 256k --plan \"cp=8,cp_kind=ulysses,zero=3,recompute=full,tiled_loss=4096\" --json\n"
      "Exit codes: 0 fits, 3 does not fit, 2 bad input.");
  return [args, &common]() {
    Job job = resolve_job(args->job, common);
    Prediction p = predict(job.model, job.cluster, job.runtime, job.plan, job.seq);
    json j = prediction_to_json(p);
    if (!args->out.empty()) write_file_atomic(args->out, json_dump(j) + "\n");
    if (args->json) std::cout << json_dump(j) << "\n";
    else std::cout << print_table(p);
    return p.memory.fits() ? kExitOk : kExitDoesNotFit;
  };
}

}  // namespace ctx
