// `ctxplan launch`: the mpirun command (and optionally a Slurm batch script) that runs a plan with
// ctxrun. The plan comes from --plan or from a file: ctxplan.plan/1 (the GUI's export, hand-written),
// ctxplan.search/1 (`ctxplan plan --json`: the --pick'th ranked plan), ctxplan.prediction/1
// (`ctxplan predict --json`) or ctxplan.measurement/1 (`ctxrun --report`: the same job again).
// Exit 0 printed, 2 bad input, 3 the plan does not fit (the same check ctxrun makes before allocating).
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <regex>

#include "costmodel/attention_kernels.hpp"
#include "costmodel/errors.hpp"
#include "costmodel/exit_codes.hpp"
#include "planner/commands.hpp"
#include "planner/format.hpp"
#include "planner/job_args.hpp"
#include "planner/launch.hpp"

namespace fs = std::filesystem;

namespace ctx {
namespace {

// Slurm's --time forms (sbatch(1)): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S; a field after the first is
// two digits at most and within its clock range (99:99:99 was taken).
bool valid_slurm_time(const std::string& t) {
  static const std::regex form(R"(^(\d{1,7})$|^(\d{1,7}):(\d{1,2})$|^(\d{1,5}):(\d{1,2}):(\d{1,2})$|^(\d{1,4})-(\d{1,2})(:(\d{1,2})(:(\d{1,2}))?)?$)");
  std::smatch m;
  if (!std::regex_match(t, m, form)) return false;
  auto in = [&](int g, int hi) { return !m[g].matched || std::stoi(m[g].str()) <= hi; };
  return in(3, 59) && in(5, 59) && in(6, 59) && in(8, 23) && in(10, 59) && in(12, 59);
}

struct LaunchArgs {
  JobArgs job;
  int64_t pick = 1, steps = 20, cpus = -1;  // cpus -1: not given
  std::string slurm, ctxrun, backend = "cuda", mpirun = "mpirun", report, extra, mpi_extra, bind = "numa", time, job_name, partition,
                             account, launcher = "srun";
  std::vector<std::string> env;
  bool local = false, json = false, no_fit_check = false;
};

// The ctxrun next to this ctxplan in a build tree (build/planner/ctxplan -> build/executor/ctxrun),
// else the one on PATH.
std::string default_ctxrun() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    fs::path c = self.parent_path().parent_path() / "executor" / "ctxrun";
    if (fs::exists(c, ec)) return c.string();
  }
  return "ctxrun";
}

// A path argument the ranks will open: absolute when it names a file or folder here (ranks may
// start elsewhere), unchanged otherwise (a profile name, a cluster shorthand).
std::string absolute_if_exists(const std::string& arg) {
  std::error_code ec;
  if (!arg.empty() && fs::exists(arg, ec)) return fs::absolute(arg, ec).string();
  return arg;
}

struct LaunchJob {
  Profiles profiles;
  std::string model_arg, cluster_arg, runtime_arg, seq_arg;
  bool runtime_given = false;  // --runtime, or the plan file's "runtime"
  Plan plan;
  std::string plan_where = "--plan";
  std::string plan_file;  // absolute, for a ctxplan.plan/1 file ctxrun can read itself
  std::string file_attention;  // the plan file's "attention", if any
};

LaunchJob resolve_launch_job(const LaunchArgs& a, const CommonOptions& common) {
  LaunchJob j;
  j.profiles = load_profiles(common.profiles.empty() ? default_profiles_dir() : common.profiles);
  j.model_arg = a.job.model;
  j.cluster_arg = a.job.cluster;
  j.runtime_arg = a.job.runtime;
  j.runtime_given = a.job.runtime_opt->count() > 0;
  j.seq_arg = a.job.seq;
  const std::string& file = a.job.plan_file;
  if (!file.empty()) {
    if (!a.job.plan.empty()) throw InputError("--plan", "", "give either --plan or --plan-file, not both");
    json doc = read_json_file(file);
    JsonReader r(doc, file);
    const std::string valid =
        "\"ctxplan.plan/1\" (the GUI's export or a hand-written plan), \"ctxplan.search/1\" (`ctxplan plan --json`), "
        "\"ctxplan.prediction/1\" (`ctxplan predict --json`) or \"ctxplan.measurement/1\" (`ctxrun --report`: the same job again)";
    if (!r.has("schema") || !r.raw("schema").is_string()) r.fail("schema", "missing; expected " + valid);
    const std::string schema = r.string("schema");
    j.plan_where = file;
    if (schema == "ctxplan.plan/1" || schema == "ctxplan.prediction/1" || schema == "ctxplan.measurement/1") {
      if (!r.has("plan")) r.fail("plan", "missing; expected an object of plan keys such as {\"tp\": 2, \"cp\": 4}");
      j.plan = plan_from_json(r.raw("plan"), file);
      if (schema == "ctxplan.plan/1") j.plan_file = fs::absolute(file).string();
    } else if (schema == "ctxplan.search/1") {
      if (!r.has("top")) r.fail("top", "missing; expected the ranked plans of `ctxplan plan --json`");
      const json& top = r.raw("top");
      if (!top.is_array()) r.fail("top", "expected an array of ranked plans");
      if (top.empty())
        r.fail("top", "is empty: the search found no plan that fits" +
                          (r.has("no_fit") && r.raw("no_fit").is_string() ? " (" + r.raw("no_fit").get<std::string>() + ")"
                                                                          : std::string()));
      if (a.pick < 1 || a.pick > static_cast<int64_t>(top.size()))
        throw InputError("--pick", "", std::to_string(a.pick) + " is not a ranked plan of " + file + "; valid: 1.." +
                                           std::to_string(top.size()));
      const size_t i = static_cast<size_t>(a.pick - 1);
      const std::string field = "top[" + std::to_string(i) + "].plan";
      if (!top[i].is_object() || !top[i].contains("plan")) r.fail(field, "missing; expected an object of plan keys");
      j.plan = plan_from_json(top[i]["plan"], file + " (" + field + ")");
    } else {
      r.fail("schema", "expected " + valid + ", got \"" + schema + "\"");
    }
    // the file's job applies unless given on the command line
    if (r.has("model") && a.job.model_opt->count() == 0) j.model_arg = r.string("model");
    if (r.has("cluster") && a.job.cluster_opt->count() == 0) j.cluster_arg = r.string("cluster");
    if (r.has("runtime") && a.job.runtime_opt->count() == 0) {
      j.runtime_arg = r.string("runtime");
      j.runtime_given = true;
    }
    if (r.has("seq") && a.job.seq_opt->count() == 0) j.seq_arg = std::to_string(r.integer_in("seq", 1, int64_t(1) << 34));
    if (r.has("attention")) j.file_attention = r.string("attention");
  } else if (!a.job.plan.empty()) {
    j.plan = parse_plan(a.job.plan, "--plan");
  } else {
    throw InputError("--plan", "",
                     "launch needs a plan: --plan-file plan.json (ctxplan.plan/1 from the GUI's export, ctxplan.search/1 "
                     "from `ctxplan plan --json`, ctxplan.prediction/1 from `ctxplan predict --json`) or --plan \"tp=2,...\"");
  }
  return j;
}

}  // namespace

std::function<int()> add_launch_command(CLI::App& app, CommonOptions& common) {
  auto a = std::make_shared<LaunchArgs>();
  add_job_options(app, a->job, true);
  app.get_option("--plan")->description("plan as key=value,... (see ctxplan predict --help); launch has no default plan");
  app.get_option("--plan-file")->description(
      "ctxplan.plan/1 (GUI export), ctxplan.search/1 (ctxplan plan --json, see --pick), ctxplan.prediction/1 (ctxplan "
      "predict --json) or ctxplan.measurement/1 (ctxrun --report); its model, cluster and seq apply unless given");
  app.add_option("--pick", a->pick, "with a ctxplan.search/1 file: which ranked plan (default 1, the best)");
  app.add_option("--steps,-n", a->steps, "ctxrun --steps: optimizer steps to run (default 20)");
  app.add_option("--report", a->report, "ctxrun --report: where the run writes its Measurement JSON");
  app.add_option("--backend", a->backend,
                 "ctxrun --backend: cuda (default: every hardware profile is a GPU, so the ranks run the CUDA backend) or "
                 "cpu (the Eigen reference, e.g. with --local); the prediction uses that backend's runtime profile "
                 "(ctxrun-cuda or ctxrun-cpu)");
  app.add_option("--ctxrun", a->ctxrun, "the ctxrun executable (default: the one next to this ctxplan, else ctxrun on PATH)");
  app.add_option("--mpirun", a->mpirun, "the mpirun executable (default mpirun)");
  app.add_option("--extra", a->extra, "more ctxrun arguments, one string: --extra=\"--data train.bin --lr 1e-3\"");
  app.add_option("--mpi-extra", a->mpi_extra, "more mpirun options, one string: --mpi-extra=\"--allow-run-as-root\"");
  app.add_option("--env", a->env, "NAME=VALUE exported to every rank (repeatable)");
  app.add_option("--cpus-per-rank", a->cpus, "cores and OMP threads per rank (default 8; 1 with --local)");
  app.add_option("--bind", a->bind, "rank binding: numa (default: the cores and memory near the rank's GPU), core, none");
  app.add_flag("--local", a->local, "run every rank on this machine: --oversubscribe, no binding (tests, CPU runs)");
  app.add_flag("--no-fit-check", a->no_fit_check, "launch even when the memory model says the plan does not fit");
  app.add_option("--slurm", a->slurm, "also write a Slurm batch script here");
  app.add_option("--launcher", a->launcher, "in the Slurm script: srun (default, --mpi=pmix) or mpirun");
  app.add_option("--time", a->time, "Slurm --time (default: 10 min + twice the predicted steps)");
  app.add_option("--job-name", a->job_name, "Slurm --job-name (default ctxrun-<model>-s<seq>)");
  app.add_option("--partition", a->partition, "Slurm --partition");
  app.add_option("--account", a->account, "Slurm --account");
  app.add_flag("--json", a->json, "print the command, its parts and the prediction as JSON (schema ctxplan.launch/1)");
  app.footer(
      "Examples:\n"
      "  ctxplan launch --plan-file plan.json --steps 100 --report run.json\n"
      "  ctxplan plan --model Llama-3.1-8B --cluster 4x8xh100 --seq 1m --json > plans.json\n"
      "  ctxplan launch --plan-file plans.json --pick 2 --slurm job.sbatch --partition gpu\n"
      "  ctxplan launch --model tiny --cluster 1x2xh100 --seq 256 --plan tp=2 --backend cpu --local --steps 3 | bash\n"
      "Exit codes: 0 printed, 3 the plan does not fit (--no-fit-check overrides), 2 bad input.");
  return [a, &common]() {
    if (a->steps < 0) throw InputError("--steps", "", "must be >= 0, got " + std::to_string(a->steps));
    if (a->bind != "numa" && a->bind != "core" && a->bind != "none")
      throw InputError("--bind", "", "expected numa, core or none, got '" + a->bind + "'");
    if (a->backend != "cuda" && a->backend != "cpu")
      throw InputError("--backend", "", "expected cuda or cpu, got '" + a->backend + "'");
    if (a->launcher != "srun" && a->launcher != "mpirun")
      throw InputError("--launcher", "", "expected srun or mpirun, got '" + a->launcher + "'");
    const int64_t cpus = a->cpus >= 0 ? a->cpus : (a->local ? 1 : 8);
    if (cpus < 1 || cpus > 1024) throw InputError("--cpus-per-rank", "", "must be 1..1024, got " + std::to_string(a->cpus));
    if (!a->time.empty() && !valid_slurm_time(a->time))
      throw InputError("--time", "", "expected a Slurm time (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS; "
                                     "minutes and seconds 0..59, hours 0..23) such as 90, 02:00:00 or 1-12:00:00, got '" +
                                         a->time + "'");

    LaunchJob lj = resolve_launch_job(*a, common);
    LaunchRequest r;
    r.seq = parse_tokens(lj.seq_arg, "--seq");
    r.model = resolve_model(lj.profiles, lj.model_arg);
    r.cluster = resolve_cluster(lj.profiles, lj.cluster_arg);
    check_launch_world(lj.plan, r.cluster, lj.plan_where);
    // ctxrun's backend is what runs: predict with its profile whatever runtime the plan was searched for
    const std::string rt_name = ctxrun_runtime_for_backend(a->backend);
    RuntimeProfile rt = resolve_runtime(lj.profiles, rt_name);
    if (lj.runtime_given && lj.runtime_arg != rt_name)
      std::cerr << "ctxplan launch: warning: the plan was made for runtime '" << lj.runtime_arg << "'; ctxrun --backend "
                << a->backend << " runs it, so the prediction is " << rt_name << "'s\n";
    // ctxrun runs its own attention: --attention must be one it runs; a plan file's is a warning like its runtime
    if (a->job.attention_opt->count() > 0) rt = with_attention(std::move(rt), a->job.attention, "--attention", "");
    else if (!lj.file_attention.empty() && canonical_attention(lj.file_attention) != rt.attention_kernels.front())
      std::cerr << "ctxplan launch: warning: the plan was made for attention '" << lj.file_attention << "'; ctxrun --backend "
                << a->backend << " runs " << rt.attention_kernels.front() << ", so the prediction prices that\n";
    {  // the plan's own errors first, without pad=1 among the ways out: ctxrun does not pad
      Plan checked = lj.plan;
      PlanCheck chk = check_plan(checked, r.model, r.cluster, r.seq);
      chk.alternatives.erase(std::remove(chk.alternatives.begin(), chk.alternatives.end(), "pad=1"), chk.alternatives.end());
      if (!chk.ok())
        throw InputError(lj.plan_where, "", "the plan cannot run on " + r.cluster.name + " at " + std::to_string(r.seq) +
                                                " tokens: " + chk.message());
    }
    Prediction p = predict(r.model, r.cluster, rt, lj.plan, r.seq);
    if (p.pad_tokens > 0)  // ctxrun refuses it too (executor_plan_problem): say so before writing the job
      throw InputError(lj.plan_where, "pad",
                       "ctxrun does not pad sequences: pad=1 pads " + std::to_string(r.seq) + " tokens to " +
                           std::to_string(r.seq + p.pad_tokens) + "; valid: pad=0 with --seq a multiple of " +
                           std::to_string(seq_granule(p.plan)));
    r.plan = p.plan;  // dp resolved
    if (!p.memory.fits() && !a->no_fit_check) {
      std::cerr << "ctxplan launch: the plan does not fit: " << plan_to_string(p.plan) << " needs " << gib(p.memory.peak.total())
                << " GiB per GPU of " << gib(p.memory.device_capacity_bytes) << " GiB usable (host "
                << gib(p.memory.host_total_bytes_per_node) << " of " << gib(p.memory.host_capacity_bytes_per_node)
                << " GiB per node); ctxrun would refuse it too. `ctxplan plan` finds one that fits; --no-fit-check "
                   "launches anyway\n";
      return kExitDoesNotFit;
    }
    std::error_code ec;
    r.model_arg = fs::exists(lj.model_arg, ec) ? absolute_if_exists(lj.model_arg) : r.model.name;
    r.cluster_arg = absolute_if_exists(lj.cluster_arg);
    r.profiles_dir = fs::absolute(lj.profiles.dir).string();
    r.plan_file = lj.plan_file;
    r.ctxrun = a->ctxrun.empty() ? default_ctxrun() : absolute_if_exists(a->ctxrun);
    r.backend = a->backend;
    r.mpirun = a->mpirun;
    r.report = a->report;
    r.steps = a->steps;
    r.cpus_per_rank = cpus;
    r.bind = a->bind;
    r.local = a->local;
    r.no_fit_check = a->no_fit_check;
    r.ctxrun_extra = split_shell_words(a->extra, "--extra");
    r.mpirun_extra = split_shell_words(a->mpi_extra, "--mpi-extra");
    r.env = a->env;
    LaunchCommand cmd = make_launch_command(r);
    if (!a->slurm.empty()) {
      SlurmOptions s;
      s.job_name = a->job_name;
      s.time = a->time;
      s.partition = a->partition;
      s.account = a->account;
      s.launcher = a->launcher;
      write_file_atomic(a->slurm, slurm_script(r, cmd, p, s));
    }
    if (a->json) {
      json j = launch_to_json(r, cmd, p);
      if (!a->slurm.empty()) j["slurm_file"] = a->slurm;
      std::cout << json_dump(j) << "\n";
    } else {
      std::cout << launch_text(r, cmd, p);
      if (!a->slurm.empty()) std::cout << "# wrote " << a->slurm << ": submit with sbatch " << shell_quote(a->slurm) << "\n";
    }
    return kExitOk;
  };
}

}  // namespace ctx
