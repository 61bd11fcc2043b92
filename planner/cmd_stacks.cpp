// `ctxplan import STACK FILE` and `ctxplan export STACK`: a Megatron-LM / torchtitan / DeepSpeed /
// ArcticTraining configuration to a ctxplan.plan/1 file and back (planner/stacks.hpp; the mapping
// tables with their sources are docs/STACKS.md). Exit 0 done, 2 bad input (file, option, valid values).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "costmodel/errors.hpp"
#include "costmodel/exit_codes.hpp"
#include "costmodel/plan_check.hpp"
#include "planner/commands.hpp"
#include "planner/format.hpp"
#include "planner/job_args.hpp"
#include "planner/stacks.hpp"

namespace fs = std::filesystem;

namespace ctx {
namespace {

std::string read_text(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path, "", "no such file");
  if (fs::is_directory(path, ec)) throw InputError(path, "", "is a folder; expected a configuration file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "", "cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (s.size() > (size_t(64) << 20)) throw InputError(path, "", "larger than 64 MiB; expected a configuration file");
  return s;
}

// --set "k=v,...": plan keys that replace (or complete) what the file said.
Plan apply_overrides(const Plan& p, const std::string& set) {
  if (set.empty()) return p;
  json j = plan_to_json(p);
  Plan only = parse_plan(set, "--set");  // validates the keys and values first
  (void)only;
  std::stringstream ss(set);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos) continue;
    std::string k = item.substr(0, eq), v = item.substr(eq + 1);
    k.erase(0, k.find_first_not_of(" \t"));
    k.erase(k.find_last_not_of(" \t") + 1);
    j[k] = v;
    if (k == "cp_kind" && v != "usp") j.erase("ulysses");
  }
  return plan_from_json(j, "--set");
}

struct ImportArgs {
  std::string stack, file, out, cluster, model, runtime, set;
  bool quiet = false;
};

struct ExportArgs {
  JobArgs job;
  std::string stack, out;
  int64_t pick = 1;
};

// The job to export: --plan-file (ctxplan.plan/1, ctxplan.search/1 with --pick, ctxplan.prediction/1)
// or the job flags with --plan.
ExportJob resolve_export_job(const ExportArgs& a, const CommonOptions& common, Profiles& profiles) {
  profiles = load_profiles(common.profiles.empty() ? default_profiles_dir() : common.profiles);
  std::string model_arg = a.job.model, cluster_arg = a.job.cluster, seq_arg = a.job.seq;
  Plan plan;
  if (!a.job.plan_file.empty()) {
    if (!a.job.plan.empty()) throw InputError("--plan", "", "give either --plan or --plan-file, not both");
    const std::string& file = a.job.plan_file;
    json doc = read_json_file(file);
    JsonReader r(doc, file);
    const std::string valid = "\"ctxplan.plan/1\" (ctxplan import, the GUI's export), \"ctxplan.search/1\" (`ctxplan plan "
                              "--json`, see --pick) or \"ctxplan.prediction/1\" (`ctxplan predict --json`)";
    if (!r.has("schema") || !r.raw("schema").is_string()) r.fail("schema", "missing; expected " + valid);
    const std::string schema = r.string("schema");
    if (schema == "ctxplan.plan/1" || schema == "ctxplan.prediction/1") {
      if (!r.has("plan")) r.fail("plan", "missing; expected an object of plan keys");
      plan = plan_from_json(r.raw("plan"), file);
    } else if (schema == "ctxplan.search/1") {
      if (!r.has("top") || !r.raw("top").is_array() || r.raw("top").empty())
        r.fail("top", "missing or empty: the search found no plan that fits");
      const json& top = r.raw("top");
      if (a.pick < 1 || a.pick > static_cast<int64_t>(top.size()))
        throw InputError("--pick", "", std::to_string(a.pick) + " is not a ranked plan of " + file + "; valid: 1.." +
                                           std::to_string(top.size()));
      const json& t = top[static_cast<size_t>(a.pick - 1)];
      if (!t.is_object() || !t.contains("plan")) r.fail("top", "entry " + std::to_string(a.pick) + " has no plan");
      plan = plan_from_json(t["plan"], file);
    } else {
      r.fail("schema", "expected " + valid + ", got \"" + schema + "\"");
    }
    if (r.has("model") && a.job.model_opt->count() == 0) model_arg = r.string("model");
    if (r.has("cluster") && a.job.cluster_opt->count() == 0) cluster_arg = r.string("cluster");
    if (r.has("seq") && a.job.seq_opt->count() == 0) seq_arg = std::to_string(r.integer_in("seq", 1, int64_t(1) << 34));
  } else if (!a.job.plan.empty()) {
    plan = parse_plan(a.job.plan, "--plan");
  } else {
    throw InputError("--plan", "", "export needs a plan: --plan-file plan.json (ctxplan import, the GUI's export), a "
                                   "`ctxplan plan --json` search (with --pick N) or --plan \"tp=2,...\"");
  }
  ExportJob job;
  job.model_arg = model_arg;
  job.model = resolve_model(profiles, model_arg);
  ClusterSpec cluster = resolve_cluster(profiles, cluster_arg);
  job.seq = parse_tokens(seq_arg, "--seq");
  job.nodes = cluster.nodes;
  job.gpus_per_node = cluster.gpus_per_node;
  PlanCheck check = check_plan(plan, job.model, cluster, job.seq);
  if (!check.ok()) throw InputError(a.job.plan_file.empty() ? "--plan" : a.job.plan_file, "plan", check.message());
  job.plan = plan;
  return job;
}

}  // namespace

std::function<int()> add_import_command(CLI::App& app, CommonOptions& common) {
  auto a = std::make_shared<ImportArgs>();
  app.add_option("stack", a->stack, "megatron | torchtitan | deepspeed | arctic")->required();
  app.add_option("file", a->file,
                 "the stack's configuration: Megatron-LM/NeMo arguments (a launch line or the argument list), a torchtitan "
                 "job TOML, a DeepSpeed config JSON, an ArcticTraining YAML")
      ->required();
  app.add_option("--out,-o", a->out, "write the ctxplan.plan/1 file here (default: print it); a model shape that matches "
                                     "no profile is written beside it as <stem>.model.json");
  app.add_option("--cluster,-c", a->cluster,
                 "the cluster the job runs on (profile or <nodes>x<gpus>x<gpu>): fixes dp and turns a global batch into "
                 "gradient accumulation (default: the file's torchrun/srun launch line, else not stated)");
  app.add_option("--model,-m", a->model, "name the model (profile, alias or config.json) instead of the file's model fields");
  app.add_option("--runtime,-r", a->runtime, "runtime profile for the plan file (default: the stack's: megatron, torchtitan, hf-deepspeed)");
  app.add_option("--set", a->set, "plan keys to set after reading, e.g. \"recompute=full,mask=doc:8192\"");
  app.add_flag("--quiet,-q", a->quiet, "do not list the options that have no effect on memory or time");
  app.footer(
      "Examples:\n"
      "  ctxplan import megatron train_llama.sh -o plan.json && ctxplan predict --plan-file plan.json\n"
      "  ctxplan import torchtitan llama3_8b.toml --cluster 4x8xh100 -o plan.json\n"
      "  ctxplan import deepspeed ds_config.json --model Llama-3.1-8B --set recompute=full -o plan.json\n"
      "  ctxplan import arctic run-sp8-llama-8b.yml --cluster 8xh100 -o plan.json\n"
      "Options ctxplan does not model are listed as warnings; options that change the answer and cannot be modelled "
      "(pipeline parallel, HSDP, partial recompute) exit 2. Mapping tables: docs/STACKS.md.");
  return [a, &common]() {
    const Stack stack = parse_stack(a->stack, "import");
    const std::string text = read_text(a->file);
    Profiles profiles = load_profiles(common.profiles.empty() ? default_profiles_dir() : common.profiles);
    ImportOptions o;
    std::optional<ClusterSpec> cluster;
    if (!a->cluster.empty()) {
      cluster = resolve_cluster(profiles, a->cluster);
      o.world = world_size(*cluster);
    }
    o.model = a->model;
    StackJob sj = import_stack(stack, text, a->file, profiles, o);
    sj.plan = apply_overrides(sj.plan, a->set);
    std::ostream& report = a->out.empty() ? std::cerr : std::cout;

    json doc = {{"schema", "ctxplan.plan/1"}};
    std::string model = sj.model;
    if (sj.model_spec) {
      fs::path mpath = a->out.empty() ? fs::path("imported.model.json") : fs::path(a->out).replace_extension(".model.json");
      write_file_atomic(mpath.string(), model_to_json(*sj.model_spec).dump(2) + "\n");
      model = fs::absolute(mpath).string();
      report << "model: the file's shape matches no profile; written to " << mpath.string() << "\n";
    }
    if (!model.empty()) doc["model"] = model;
    if (cluster) doc["cluster"] = a->cluster;
    if (sj.seq > 0) doc["seq"] = sj.seq;
    const std::string runtime = a->runtime.empty() ? sj.runtime : a->runtime;
    resolve_runtime(profiles, runtime);  // a bad --runtime exits 2 here, not at predict time
    doc["runtime"] = runtime;
    // With model, cluster and sequence known, the plan must be one ctxplan can run.
    if (!model.empty() && cluster && sj.seq > 0) {
      ModelSpec m = resolve_model(profiles, model);
      Plan checked = sj.plan;
      PlanCheck check = check_plan(checked, m, *cluster, sj.seq);
      if (!check.ok()) throw InputError(a->file, "", "the imported plan " + plan_to_string(sj.plan) + " cannot run: " + check.message());
      sj.plan.dp = checked.dp;
    }
    doc["plan"] = plan_to_json(sj.plan);
    if (!a->out.empty()) write_file_atomic(a->out, doc.dump(2) + "\n");
    else std::cout << doc.dump(2) << "\n";

    report << "ctxplan import " << to_string(stack) << " " << a->file << ": plan " << plan_to_string(sj.plan)
           << (sj.plan.dp == 0 ? " (dp fills the cluster given at predict time)" : "") << "\n";
    report << "  model " << (model.empty() ? "(not stated: give --model at predict time)" : model) << ", seq "
           << (sj.seq > 0 ? std::to_string(sj.seq) + " tokens" : "(not stated)") << ", GPUs "
           << (sj.world > 0 ? std::to_string(sj.world) : "(not stated)") << ", cluster "
           << (cluster ? a->cluster : "(not stated: give --cluster here or at predict time)") << ", runtime " << runtime << "\n";
    if (!a->out.empty()) report << "  wrote " << a->out << "\n";
    for (const std::string& w : sj.warnings) std::cerr << "warning: " << w << "\n";
    if (!a->quiet && !sj.ignored.empty())
      std::cerr << "ignored (no effect on memory or time): " << stacks::join(sj.ignored, "; ") << "\n";
    return kExitOk;
  };
}

std::function<int()> add_export_command(CLI::App& app, CommonOptions& common) {
  auto a = std::make_shared<ExportArgs>();
  app.add_option("stack", a->stack, "megatron | torchtitan | deepspeed | arctic")->required();
  add_job_options(app, a->job, true);
  app.get_option("--plan")->description("plan as key=value,... (see ctxplan predict --help)");
  app.get_option("--plan-file")->description(
      "ctxplan.plan/1 (ctxplan import, the GUI's export), ctxplan.search/1 (ctxplan plan --json, see --pick) or "
      "ctxplan.prediction/1; its model, cluster and seq apply unless given");
  app.add_option("--pick", a->pick, "with a ctxplan.search/1 file: which ranked plan (default 1, the best)");
  app.add_option("--out,-o", a->out, "write the stack's file here (default: print it)");
  app.footer(
      "Examples:\n"
      "  ctxplan export megatron --model Llama-3.1-70B --cluster 4x8xh100 --seq 256k --plan \"tp=8,cp=4,zero=1,recompute=full\" -o args.sh\n"
      "  ctxplan plan --model Llama-3.1-8B --cluster 8xh100 --seq 512k --json > s.json && ctxplan export arctic --plan-file s.json\n"
      "The file is read back by `ctxplan import`; what the stack cannot express is listed, with what was written instead.");
  return [a, &common]() {
    const Stack stack = parse_stack(a->stack, "export");
    Profiles profiles;
    ExportJob job = resolve_export_job(*a, common, profiles);
    // a plan the stack cannot run is refused naming the capability its runtime profile lacks, as
    // predict refuses it (issue 21); --any-runtime writes the stack's nearest equivalent with a warning
    const RuntimeProfile rt = resolve_runtime(profiles, stack_runtime(stack));
    const std::string missing = missing_capability(rt.capabilities, rt.name, job.plan);
    if (!missing.empty() && !a->job.any_runtime)
      throw InputError(a->job.plan_file.empty() ? "--plan" : a->job.plan_file, "",
                       missing + "; --any-runtime writes the file anyway (what " + to_string(stack) +
                           " cannot express is listed with what was written instead)");
    if (!missing.empty())
      std::cerr << "ctxplan export: warning: " << missing << " (written anyway: --any-runtime)\n";
    // pad=1: the stack is given the padded length (its data pipeline pads or packs to it), as
    // ctxplan priced the step; the note says so
    const int64_t real_seq = job.seq, padded = padded_seq(job.plan, job.seq);
    job.seq = padded;
    StackExport e = export_stack(stack, job, profiles);
    if (padded != real_seq)
      e.notes.push_back("pad=1: written for the padded length " + std::to_string(padded) + " (" + std::to_string(real_seq) + " tokens + " +
                        std::to_string(padded - real_seq) + " pad tokens per sequence, as ctxplan priced it): pad or pack the data to " +
                        std::to_string(padded) + " tokens");
    std::ostream& report = a->out.empty() ? std::cerr : std::cout;
    if (!a->out.empty()) {  // the launch line names the file as written
      const std::string name = fs::path(a->out).filename().string();
      for (std::string* s : {&e.text, &e.launch})
        for (size_t at = s->find(e.default_file); at != std::string::npos; at = s->find(e.default_file, at + name.size()))
          s->replace(at, e.default_file.size(), name);
    }
    if (!a->out.empty()) write_file_atomic(a->out, e.text);
    else std::cout << e.text;
    report << "ctxplan export " << to_string(stack) << ": " << job.model.name << ", seq " << real_seq << " tokens"
           << (padded != real_seq ? " (padded to " + std::to_string(padded) + ")" : std::string()) << ", "
           << job.nodes << " node(s) x " << job.gpus_per_node << " GPUs, plan " << plan_to_string(job.plan) << "\n";
    if (!a->out.empty()) report << "wrote " << a->out << "\n";
    report << "launch:\n  " << e.launch << "\n";
    for (const auto& n : e.notes) report << "note: " << n << "\n";
    if (!e.cannot_express.empty()) {
      report << to_string(stack) << " cannot express:\n";
      for (const auto& c : e.cannot_express) report << "  - " << c << "\n";
      report << "the written file runs plan " << plan_to_string(e.exported) << "\n";
    }
    return kExitOk;
  };
}

}  // namespace ctx
