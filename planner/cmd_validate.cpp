// `ctxplan validate`: every reference point the repo carries (profiles/validation/, copied with
// sources from published papers, framework docs and benchmark tables) predicted and compared:
// step time, tokens/s, TFLOPS and MFU as each source defines them, and the longest trainable
// sequence. Prints predicted vs published with the error, and the geometric-mean error per metric.
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>

#include "costmodel/prediction.hpp"
#include "planner/commands.hpp"
#include "costmodel/exit_codes.hpp"
#include "planner/format.hpp"
#include "planner/job_args.hpp"

namespace ctx {
namespace {

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path, "", "validation data not found");
  std::vector<json> out;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty()) out.push_back(parse_json_text(line, path + ":" + std::to_string(n)));
  }
  return out;
}

// The published metric, computed from a predicted step the way the source computed it.
double metric_from(const std::string& def, const ModelSpec& m, const Prediction& p) {
  const StepTime& t = p.time;
  const double world = static_cast<double>(p.world), s = static_cast<double>(p.seq);
  const double seqs = static_cast<double>(std::max<int64_t>(1, p.plan.dp) * p.plan.mbs * p.plan.ga);
  const double tokens = seqs * s, l = static_cast<double>(m.layers), h = static_cast<double>(m.hidden);
  if (def == "step_seconds") return t.step_seconds;
  if (def == "tokens_per_s_per_gpu") return t.tokens_per_second / world;
  if (def == "alst_megatron_tflops")  // Megatron-LM's formula: non-causal attention, recompute counted
    return 96.0 * seqs * s * l * h * h * (1.0 + s / (6.0 * h) + static_cast<double>(m.vocab) / (16.0 * l * h)) / (world * t.step_seconds) / 1e12;
  // model FLOPs with non-causal attention (4*s*q_dim forward per token and layer, x3 for training)
  const double noncausal = dense_train_flops_per_token(m) + 12.0 * l * static_cast<double>(q_dim(m)) * s;
  if (def == "nemo_model_tflops") return noncausal * tokens / (world * t.step_seconds) / 1e12;
  if (def == "llmfoundry_mfu")  // 6N + 12*l*d*s per token over 989 TFLOP/s per GPU, in percent
    return 100.0 * (6.0 * static_cast<double>(total_params(m)) + 12.0 * l * h * s) * t.tokens_per_second / (world * 989e12);
  throw InputError("profiles/validation", "definition", "unknown metric definition '" + def + "'");
}

}  // namespace

std::function<int()> add_validate_command(CLI::App& app, CommonOptions& common) {
  struct Args {
    bool json = false;
    std::string only;
  };
  auto a = std::make_shared<Args>();
  app.add_flag("--json", a->json, "print every row and the summary as JSON");
  app.add_option("--only", a->only, "only points whose id contains this text (e.g. alst, nemo, tt-)");
  app.footer("Reads profiles/validation/published_time.jsonl and alst_maxseq.jsonl. docs/VALIDATION.md carries the table.");
  return [a, &common]() {
    Profiles profiles = load_profiles(common.profiles.empty() ? default_profiles_dir() : common.profiles);
    const std::string dir = profiles.dir + "/validation/";
    struct Row { std::string id, metric; double published, predicted; std::string plan, note; };
    std::vector<Row> rows;
    for (const json& pt : read_jsonl(dir + "published_time.jsonl")) {
      JsonReader r(pt, dir + "published_time.jsonl");
      std::string id = r.string("id");
      if (!a->only.empty() && id.find(a->only) == std::string::npos) continue;
      ModelSpec m = resolve_model(profiles, r.string("model"));
      ClusterSpec c = resolve_cluster(profiles, r.string("cluster"));
      RuntimeProfile rt = resolve_runtime(profiles, r.string("runtime"));
      // the stack as it was when the point was measured (e.g. attention kernels before FA3-class ones)
      if (r.has("attention_kernel")) rt.attention_kernel = r.string("attention_kernel");
      Plan plan = parse_plan(r.string("plan"), id + ": plan");
      Prediction p = predict(m, c, rt, plan, r.integer("seq"));
      rows.push_back({id, r.string("metric"), r.number("published"), metric_from(r.string("definition"), m, p), plan_to_string(p.plan),
                      p.memory.fits() ? "" : "predicted not to fit"});
    }
    for (const json& pt : read_jsonl(dir + "alst_maxseq.jsonl")) {
      JsonReader r(pt, dir + "alst_maxseq.jsonl");
      std::string id = r.string("id") + ":max_seq_tokens";
      if (!a->only.empty() && id.find(a->only) == std::string::npos) continue;
      ModelSpec m = resolve_model(profiles, r.string("model"));
      ClusterSpec c = resolve_cluster(profiles, r.string("cluster"));
      const RuntimeProfile& rt = resolve_runtime(profiles, r.string("runtime"));
      Plan plan = parse_plan(r.string("plan"), id + ": plan");
      double published = r.number("published_max_seq_tokens");
      PlanCheck chk = check_plan(plan, m, c, seq_granule(plan) * 1024);
      if (!chk.ok()) throw InputError(dir + "alst_maxseq.jsonl", id, chk.message());
      int64_t s = max_trainable_seq(m, c, rt, plan, static_cast<int64_t>(published * 4));
      rows.push_back({id, "max_seq_tokens", published, static_cast<double>(s), plan_to_string(plan), ""});
    }
    std::map<std::string, std::pair<double, int>> by_metric;  // sum |ln ratio|, count
    for (auto& r : rows)
      if (r.predicted > 0 && r.published > 0) {
        auto& e = by_metric[r.metric];
        e.first += std::abs(std::log(r.predicted / r.published));
        e.second += 1;
      }
    if (a->json) {
      json jr = json::array(), js = json::object();
      for (auto& r : rows)
        jr.push_back({{"id", r.id}, {"metric", r.metric}, {"published", r.published}, {"predicted", r.predicted},
                      {"error", r.predicted / r.published - 1.0}, {"plan", r.plan}, {"note", r.note}});
      for (auto& [k, v] : by_metric) js[k] = {{"points", v.second}, {"geomean_abs_error", std::exp(v.first / v.second) - 1.0}};
      std::cout << json_dump(json{{"schema", "ctxplan.validation/1"}, {"rows", jr}, {"summary", js}}) << "\n";
      return kExitOk;
    }
    Table t;
    t.header = {"point", "published", "predicted", "error", "plan"};
    for (auto& r : rows) {
      int dec = r.published < 100 ? 2 : 0;
      t.rows.push_back({r.id, fixed(r.published, dec), fixed(r.predicted, dec), (r.predicted >= r.published ? "+" : "") +
                        fixed(100.0 * (r.predicted / r.published - 1.0), 1) + "%", r.plan + (r.note.empty() ? "" : " (" + r.note + ")")});
    }
    std::cout << "ctxplan validate: " << rows.size() << " reference points (profiles/validation/)\n" << t.render() << "\n";
    Table s;
    s.header = {"metric", "points", "geometric-mean |error|"};
    for (auto& [k, v] : by_metric) s.rows.push_back({k, std::to_string(v.second), fixed(100.0 * (std::exp(v.first / v.second) - 1.0), 1) + "%"});
    std::cout << s.render();
    return kExitOk;
  };
}

}  // namespace ctx
