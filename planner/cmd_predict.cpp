// `ctxplan predict`: one plan, its per-GPU memory by category at the timeline's peak, per-phase
// peaks, host memory per node, and the verdict (exit 0 fits, 3 does not fit).
#include <iostream>

#include "costmodel/prediction.hpp"
#include "planner/commands.hpp"
#include "planner/exit_codes.hpp"
#include "planner/format.hpp"

namespace ctx {
namespace {

// The built-in default job: Llama-3.1-8B at 128K on one 8xH100 node.
constexpr const char* kDefaultModel = "Llama-3.1-8B";
constexpr const char* kDefaultCluster = "8xh100";
constexpr const char* kDefaultSeq = "131072";
constexpr const char* kDefaultPlan = "cp=8,cp_kind=zigzag,zero=3,recompute=full,tiled_loss=2048";
constexpr const char* kDefaultRuntime = "ctxrun";

struct PredictArgs {
  std::string model = kDefaultModel, cluster = kDefaultCluster, seq = kDefaultSeq, plan, plan_file;
  std::string runtime = kDefaultRuntime, out;
  bool json = false;
};

std::string print_table(const Prediction& p) {
  const MemoryPrediction& m = p.memory;
  std::ostringstream os;
  os << "ctxplan predict: " << p.model << " on " << p.cluster << " (" << p.world << " x " << p.gpu << "), seq "
     << p.seq << " tokens, runtime " << p.runtime << "\n";
  os << "plan: " << plan_to_string(p.plan) << "\n\n";
  os << "Per-GPU memory at the peak (" << to_string(m.peak_phase);
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
  os << "  phases: forward " << fixed(st.phase_seconds[0], 3) << " s, backward " << fixed(st.phase_seconds[1], 3)
     << " s, optimizer " << fixed(st.phase_seconds[2], 3) << " s\n";
  os << "  where it goes: compute " << fixed(st.breakdown.compute, 3) << " s, exposed comm " << fixed(st.breakdown.exposed_comm, 3)
     << " s, offload stall " << fixed(st.breakdown.offload_stall, 3) << " s, imbalance " << fixed(st.breakdown.imbalance, 3)
     << " s, optimizer " << fixed(st.breakdown.optimizer, 3) << " s\n";
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
  }
  return os.str();
}

}  // namespace

std::function<int()> add_predict_command(CLI::App& app, CommonOptions& common) {
  auto args = std::make_shared<PredictArgs>();
  auto* model_opt = app.add_option("--model,-m", args->model,
                 "model profile name/alias, a profile JSON, or a Hugging Face config.json (default Llama-3.1-8B)");
  auto* cluster_opt = app.add_option("--cluster,-c", args->cluster,
                 "cluster profile, or <nodes>x<gpus per node>x<gpu> such as 8xh100, 16x8xh200 (default 8xh100)");
  auto* seq_opt = app.add_option("--seq,-s", args->seq, "sequence length in tokens: 131072, 128k, 1m (default 131072)");
  app.add_option("--plan,-p", args->plan,
                 "plan as key=value,... (keys: dp tp sp cp cp_kind ulysses zero mbs ga recompute ckpt_offload "
                 "opt_offload param_offload tiled_loss tiled_mlp mask precision order; default: " +
                     std::string(kDefaultPlan) + ")");
  app.add_option("--plan-file", args->plan_file, "plan.json (may also carry model, cluster, seq, runtime)");
  auto* runtime_opt = app.add_option("--runtime,-r", args->runtime, "runtime profile: ctxrun | hf-deepspeed | megatron (default ctxrun)");
  app.add_flag("--json", args->json, "print the Prediction as JSON (schema ctxplan.prediction/1)");
  app.add_option("--out,-o", args->out, "also write the Prediction JSON to this file");
  app.footer(
      "Examples:\n"
      "  ctxplan predict\n"
      "  ctxplan predict --model Llama-3.1-70B --cluster 4x8xh100 --seq 1m --plan \"tp=8,cp=4,cp_kind=zigzag,zero=1,recompute=full\"\n"
      "  ctxplan predict --model ./config.json --cluster 8xh200 --seq 256k --plan \"cp=8,cp_kind=ulysses,zero=3,recompute=full,tiled_loss=4096\" --json\n"
      "Exit codes: 0 fits, 3 does not fit, 2 bad input.");
  return [args, &common, model_opt, cluster_opt, seq_opt, runtime_opt]() {
    Profiles profiles = load_profiles(common.profiles.empty() ? default_profiles_dir() : common.profiles);
    std::string model_arg = args->model, cluster_arg = args->cluster, runtime_arg = args->runtime, seq_arg = args->seq;
    Plan plan;
    if (!args->plan_file.empty()) {
      json j = read_json_file(args->plan_file);
      JsonReader r(j, args->plan_file);
      std::string schema = r.string_or("schema", "");
      if (schema != "ctxplan.plan/1") r.fail("schema", "expected \"ctxplan.plan/1\", got \"" + schema + "\"");
      plan = plan_from_json(r.raw("plan"), args->plan_file);
      // the file's model/cluster/seq apply unless given on the command line
      if (r.has("model") && model_opt->count() == 0) model_arg = r.string("model");
      if (r.has("cluster") && cluster_opt->count() == 0) cluster_arg = r.string("cluster");
      if (r.has("runtime") && runtime_opt->count() == 0) runtime_arg = r.string("runtime");
      if (r.has("seq") && seq_opt->count() == 0) seq_arg = std::to_string(r.integer_in("seq", 1, int64_t(1) << 34));
      if (!args->plan.empty()) throw InputError("--plan", "", "give either --plan or --plan-file, not both");
    } else {
      plan = parse_plan(args->plan.empty() ? kDefaultPlan : args->plan, "--plan");
    }
    int64_t seq = parse_tokens(seq_arg, "--seq");
    ModelSpec model = resolve_model(profiles, model_arg);
    ClusterSpec cluster = resolve_cluster(profiles, cluster_arg);
    const RuntimeProfile& rt = resolve_runtime(profiles, runtime_arg);
    Prediction p = predict(model, cluster, rt, plan, seq);
    json j = prediction_to_json(p);
    if (!args->out.empty()) write_file_atomic(args->out, j.dump(2) + "\n");
    if (args->json) std::cout << j.dump(2) << "\n";
    else std::cout << print_table(p);
    return p.memory.fits() ? kExitOk : kExitDoesNotFit;
  };
}

}  // namespace ctx
