// The search commands: `plan` (best plans for one job), `maxseq` (longest trainable sequence per
// GPU count), `sweep` (grids of sequence length x GPU count) and `budget` (a staged
// context-extension recipe). Long searches show progress on a terminal; Ctrl-C cancels and the
// partial result is printed.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "costmodel/limits.hpp"
#include "costmodel/prediction.hpp"
#include "planner/commands.hpp"
#include "costmodel/exit_codes.hpp"
#include "planner/format.hpp"
#include "planner/job_args.hpp"
#include "planner/search.hpp"

namespace ctx {
namespace {

std::atomic<bool> g_cancel{false};
void on_sigint(int) { g_cancel = true; }

struct Progress {
  std::string what;
  bool tty = isatty(STDERR_FILENO);
  Progress(std::string w) : what(std::move(w)) {
    g_cancel = false;
    std::signal(SIGINT, on_sigint);
  }
  ~Progress() {
    if (tty) std::fprintf(stderr, "\r\033[K");
    std::signal(SIGINT, SIG_DFL);
  }
  std::function<bool(double)> fn() {
    return [this](double f) {
      if (tty) std::fprintf(stderr, "\r%s: %5.1f%%  (Ctrl-C cancels)", what.c_str(), 100.0 * f);
      return !g_cancel.load();
    };
  }
};

std::vector<CpKind> parse_kinds(const std::string& s) {
  std::vector<CpKind> out;
  std::stringstream ss(s);
  std::string k;
  while (std::getline(ss, k, ',')) {
    if (k.empty()) continue;
    Plan p = parse_plan("cp_kind=" + k, "--cp-kinds");
    out.push_back(cp_kind_of(p));
  }
  return out;
}

// --gpus: GPU counts 1..kMaxClusterGpus (a count is GPUs, not tokens: no k/m suffix needed, none refused)
std::vector<int64_t> parse_gpu_counts(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string k;
  while (std::getline(ss, k, ',')) {
    if (k.empty()) continue;
    double v = 0;
    if (k.find_first_of("eE") != std::string::npos || !parse_scaled_number(k, &v) || v != std::floor(v) || v < 1 ||
        v > static_cast<double>(kMaxClusterGpus))
      throw InputError("--gpus", "", "GPU counts must be whole numbers 1.." + std::to_string(kMaxClusterGpus) + ", got '" + k + "'");
    out.push_back(static_cast<int64_t>(v));
  }
  if (out.empty()) throw InputError("--gpus", "", "expected a comma-separated list of GPU counts, e.g. 8,16,32");
  return out;
}

std::vector<int64_t> parse_list(const std::string& s, const std::string& where) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string k;
  while (std::getline(ss, k, ','))
    if (!k.empty()) out.push_back(parse_tokens(k, where));
  if (out.empty()) throw InputError(where, "", "expected a comma-separated list of numbers");
  return out;
}

struct SearchArgs {
  JobArgs job;
  std::string gbt, objective = "time", kinds, csv;
  bool json = false, no_offload = false;
  int top = 10, refine = 200;
};

void add_search_options(CLI::App& app, SearchArgs& a) {
  add_job_options(app, a.job, false);
  app.add_option("--global-batch-tokens,-g", a.gbt, "tokens per optimizer step (default: one sequence per data-parallel rank)");
  app.add_option("--cp-kinds", a.kinds, "allowed context-parallel kinds, e.g. zigzag,ulysses (default all)");
  app.add_flag("--no-offload", a.no_offload, "do not consider CPU offload (optimizer, checkpoints, parameters)");
}

SearchRequest make_request(const SearchArgs& a, const Job& job) {
  SearchRequest req;
  req.model = job.model;
  req.cluster = job.cluster;
  req.runtime = job.runtime;
  req.seq = job.seq;
  req.base = a.job.plan.empty() ? Plan{} : job.plan;
  // constraints, not seeds: every key --plan gives is kept in every plan tried (issue 21)
  if (!a.job.plan.empty()) req.fixed_fields = fixed_plan_fields(a.job.plan, "--plan");
  if (a.no_offload)
    for (const char* f : {"opt_offload", "ckpt_offload", "param_offload"})
      if (req.fixed_fields.contains(f) && req.fixed_fields[f] == true)
        throw InputError("--plan", f, std::string(f) + "=1 contradicts --no-offload; drop one of them");
  if (!a.gbt.empty()) {
    req.global_batch_tokens = parse_tokens(a.gbt, "--global-batch-tokens");
    if (req.global_batch_tokens % req.seq != 0)
      throw InputError("--global-batch-tokens", "", "must be a multiple of --seq (" + std::to_string(req.seq) + ")");
  }
  if (a.objective == "time") req.objective = Objective::time;
  else if (a.objective == "memory") req.objective = Objective::memory;
  else throw InputError("--objective", "", "expected time or memory, got '" + a.objective + "'");
  req.cp_kinds = parse_kinds(a.kinds);
  req.allow_offload = !a.no_offload;
  req.top_k = a.top;
  req.refine = a.refine;
  return req;
}

json candidate_json(const Candidate& c) {
  json t = step_time_to_json(c.time);
  return {{"plan", plan_to_json(c.plan)}, {"plan_string", plan_to_string(c.plan)}, {"peak_bytes", c.peak_bytes},
          {"capacity_bytes", c.capacity_bytes}, {"host_bytes_per_node", c.host_bytes_per_node}, {"time", t},
          {"simulated", c.simulated}, {"why", c.why}};
}

std::string csv_row(const Candidate& c) {
  std::ostringstream os;
  os << '"' << plan_to_string(c.plan) << "\"," << c.time.step_seconds << "," << c.time.tokens_per_second << "," << c.time.mfu << ","
     << c.peak_bytes / (1024.0 * 1024 * 1024) << "," << c.time.breakdown.compute << "," << c.time.breakdown.exposed_comm << ","
     << c.time.breakdown.offload_stall << "," << c.time.breakdown.imbalance << "," << c.time.breakdown.optimizer << ","
     << (c.simulated ? "simulated" : "closed-form");
  return os.str();
}
const char* kCsvHeader = "plan,step_seconds,tokens_per_second,mfu,peak_gib,compute_s,exposed_comm_s,offload_stall_s,imbalance_s,optimizer_s,method";

}  // namespace

std::function<int()> add_plan_command(CLI::App& app, CommonOptions& common) {
  auto a = std::make_shared<SearchArgs>();
  add_search_options(app, *a);
  app.add_option("--objective", a->objective, "time (fastest step, default) or memory (smallest peak)");
  app.add_option("--top,-k", a->top, "how many plans to print (default 10)");
  app.add_option("--refine", a->refine, "finalists re-ranked by the event simulator (default 200)");
  app.add_flag("--json", a->json, "print the result as JSON");
  app.add_option("--csv", a->csv, "write every fitting plan as CSV to this file ('-' for standard output)");
  app.footer(
      "Examples:\n"
      "  ctxplan plan --model Llama-3.1-8B --cluster 8xh100 --seq 256k\n"
      "  ctxplan plan --model Llama-3.1-70B --cluster h100-superpod-1024 --seq 1m --global-batch-tokens 16m\n"
      "  ctxplan plan --seq 1m --plan \"mask=doc:hist:2048@0.8/65536@0.2\" --cp-kinds zigzag,ulysses --csv plans.csv\n"
      "Exit codes: 0 plans found, 3 no plan fits (with the tightest constraint and what would help), 2 bad input.");
  return [a, &common]() {
    Job job = resolve_job(a->job, common);
    SearchRequest req = make_request(*a, job);
    check_constraints(req, "--plan");
    SearchResult r;
    {
      Progress prog("searching plans");
      r = search_plans(req, prog.fn());
    }
    // a batch that no layout divides is a bad input, with what would divide (search.cpp batch_advice)
    if (r.valid == 0 && !r.cancelled && r.no_fit_reason.rfind("the global batch", 0) == 0)
      throw InputError("--global-batch-tokens", "", r.no_fit_reason);
    std::string advice;
    if (r.ranked.empty() && !r.cancelled && r.valid > 0) advice = no_fit_advice(req);
    if (!a->csv.empty()) {
      std::ostringstream os;
      os << kCsvHeader << "\n";
      for (auto& c : r.ranked) os << csv_row(c) << "\n";
      if (a->csv == "-") std::cout << os.str();
      else write_file_atomic(a->csv, os.str());
    }
    if (a->json) {
      json top = json::array(), pareto = json::array();
      for (size_t i = 0; i < r.ranked.size() && i < static_cast<size_t>(a->top); ++i) top.push_back(candidate_json(r.ranked[i]));
      for (auto& c : r.pareto) pareto.push_back(candidate_json(c));
      json j = {{"schema", "ctxplan.search/1"}, {"model", job.model.name}, {"cluster", job.cluster.name}, {"seq", job.seq},
                {"runtime", job.runtime.name}, {"objective", a->objective}, {"enumerated", r.enumerated}, {"valid", r.valid},
                {"fitting", r.fitting}, {"simulated", r.simulated}, {"seconds", r.seconds}, {"cancelled", r.cancelled},
                {"top", top}, {"pareto", pareto}, {"not_dividing", r.not_dividing}, {"lower_precision", r.lower_precision}};
      if (r.ranked.empty()) j["no_fit"] = r.no_fit_reason + " " + advice;
      std::cout << json_dump(j) << "\n";
    } else if (a->csv != "-") {
      std::cout << "ctxplan plan: " << job.model.name << " on " << job.cluster.name << " (" << world_size(job.cluster) << " x "
                << job.cluster.gpu.name << "), seq " << job.seq << " tokens, runtime " << job.runtime.name << ", objective "
                << a->objective << "\n";
      std::cout << "evaluated " << r.enumerated << " plans in " << fixed(r.seconds, 2) << " s: " << r.valid << " valid, " << r.fitting
                << " fit in memory, " << r.simulated << " finalists simulated" << (r.cancelled ? " (CANCELLED: partial result)" : "")
                << "\n";
      if (r.not_dividing > 0)
        std::cout << r.not_dividing << " plans left out: their layout does not divide the " << job.seq
                  << "-token sequence (--plan pad=1 pads it and prices the pad tokens)\n";
      if (r.lower_precision)
        std::cout << "no plan fits at " << job.runtime.name << "'s own optimizer precision: the plans below set the lower "
                     "master/grads/moments it allows (the most precise that fits each)\n";
      std::cout << "\n";
      if (!r.ranked.empty()) {
        Table t;
        t.header = {"#", "plan", "step s", "tokens/s", "MFU", "peak GiB"};
        for (size_t i = 0; i < r.ranked.size() && i < static_cast<size_t>(a->top); ++i) {
          const Candidate& c = r.ranked[i];
          t.rows.push_back({std::to_string(i + 1), plan_to_string(c.plan), fixed(c.time.step_seconds, 3) + (c.simulated ? "" : "*"),
                            fixed(c.time.tokens_per_second, 0), fixed(100 * c.time.mfu, 1) + "%", gib(c.peak_bytes)});
        }
        std::cout << "Best plans (* = closed-form estimate, others simulated):\n" << t.render() << "\nWhy:\n";
        for (size_t i = 0; i < r.ranked.size() && i < static_cast<size_t>(a->top); ++i)
          std::cout << "  #" << i + 1 << ": " << r.ranked[i].why << "\n";
        Table pt;
        pt.header = {"plan", "step s", "peak GiB"};
        for (auto& c : r.pareto) pt.rows.push_back({plan_to_string(c.plan), fixed(c.time.step_seconds, 3), gib(c.peak_bytes)});
        std::cout << "\nPareto frontier (step time vs peak memory, " << r.pareto.size() << " plans):\n" << pt.render();
      } else {
        std::cout << (r.cancelled ? "cancelled before any plan fitted\n" : "NO PLAN FITS: " + r.no_fit_reason + "\n" + advice + "\n");
      }
    }
    if (r.cancelled) return kExitInterrupted;
    return r.ranked.empty() ? kExitDoesNotFit : kExitOk;
  };
}

std::function<int()> add_maxseq_command(CLI::App& app, CommonOptions& common) {
  struct Args : SearchArgs {
    std::string gpus, max = "64m";
    bool fixed = false;
  };
  auto a = std::make_shared<Args>();
  add_search_options(app, *a);
  app.add_option("--gpus", a->gpus, "GPU counts, e.g. 1,8,16,32 (default 1, 8, 16, 32, ... up to the cluster)");
  app.add_option("--max", a->max, "longest sequence to consider (default 64m)");
  app.add_flag("--fixed", a->fixed,
               "the longest sequence this exact --plan fits on --cluster (bisection over the memory model; unset keys at their "
               "defaults) instead of searching plans per GPU count");
  app.add_flag("--json", a->json, "print JSON");
  app.footer(
      "Every plan tried keeps the keys --plan gives (e.g. --plan cp_kind=ulysses,tiled_mlp=on searches only Ulysses plans with\n"
      "tiled MLP); --fixed answers for that one plan.\n"
      "Examples:\n  ctxplan maxseq --model Llama-3.1-8B --cluster 4x8xh100 --runtime hf-deepspeed\n"
      "  ctxplan maxseq --fixed --cluster 8xh100 --runtime hf-deepspeed --plan cp=8,cp_kind=ulysses,zero=3,recompute=full,tiled_mlp=on,tiled_loss=on\n");
  return [a, &common]() {
    Job job = resolve_job(a->job, common);
    int64_t hi = parse_tokens(a->max, "--max");
    if (a->fixed) {
      // the plan as given: the longest sequence it fits (bisection in its sequence granules)
      if (!a->gpus.empty()) throw InputError("--gpus", "", "--fixed answers for the plan on --cluster; leave out --gpus");
      Plan plan = job.plan;
      const int64_t g = seq_granule(plan);
      PlanCheck chk = check_plan(plan, job.model, job.cluster, g);
      if (!chk.ok()) throw InputError("--plan", "", "cannot run on " + job.cluster.name + ": " + chk.message());
      const int64_t s = max_trainable_seq(job.model, job.cluster, job.runtime, plan, hi);
      if (a->json) {
        std::cout << json_dump(json{{"schema", "ctxplan.maxseq/1"}, {"model", job.model.name}, {"runtime", job.runtime.name},
                                    {"cluster", job.cluster.name}, {"fixed", true}, {"plan", plan_to_string(plan)}, {"max_seq", s},
                                    {"granule", g}})
                  << "\n";
      } else {
        std::cout << "ctxplan maxseq --fixed: " << job.model.name << " on " << job.cluster.name << ", runtime " << job.runtime.name
                  << "\nplan: " << plan_to_string(plan) << "\n";
        if (s > 0 && s + g > hi) std::cout << "it fits up to --max: " << s << " tokens (raise --max to look further)\n";
        else if (s > 0) std::cout << "longest sequence that fits: " << s << " tokens (" << s + g << " does not; sequences step by " << g << ")\n";
        else std::cout << "nothing fits, not even " << g << " tokens\n";
      }
      return s > 0 ? kExitOk : kExitDoesNotFit;
    }
    a->job.seq = "4096";
    SearchRequest req = make_request(*a, job);
    {
      SearchRequest any_seq = req;
      any_seq.seq = 0;  // the sequence is what maxseq searches: the keys are checked without one
      check_constraints(any_seq, "--plan");
    }
    std::vector<int64_t> counts;
    if (a->gpus.empty()) {
      counts.push_back(1);
      for (int64_t n = std::min<int64_t>(8, job.cluster.gpus_per_node); n <= world_size(job.cluster); n *= 2) counts.push_back(n);
    } else {
      counts = parse_gpu_counts(a->gpus);
    }
    json rows = json::array();
    Table t;
    t.header = {"GPUs", "max seq", "plan", "step s", "tokens/s"};
    Progress prog("maxseq");
    auto fn = prog.fn();
    std::string lower_notes;
    for (size_t i = 0; i < counts.size(); ++i) {
      if (!fn(static_cast<double>(i) / static_cast<double>(counts.size()))) break;
      SearchRequest r = req;
      r.cluster = resized_cluster(job.cluster, counts[i]);
      Plan best;
      int64_t s = max_trainable_seq_any(r, hi, &best);
      // the cluster grows to whole nodes: rows say the GPUs planned on (and the count asked for)
      const int64_t gpus = world_size(r.cluster);
      json row = {{"gpus", gpus}, {"max_seq", s}};
      if (gpus != counts[i]) row["gpus_requested"] = counts[i];
      std::vector<std::string> cells = {gpus == counts[i] ? std::to_string(gpus)
                                                          : std::to_string(gpus) + " (asked " + std::to_string(counts[i]) + ")",
                                        std::to_string(s), s ? plan_to_string(best) : "(nothing fits)", "", ""};
      if (s > 0) {
        StepTime st = estimate_step(step_costs(r.model, r.cluster, r.runtime, best, s, false));
        row["plan"] = plan_to_string(best);
        row["step_seconds"] = st.step_seconds;
        row["tokens_per_second"] = st.tokens_per_second;
        cells[3] = fixed(st.step_seconds, 2);
        cells[4] = fixed(st.tokens_per_second, 0);
      }
      // beside the answer at the runtime's own optimizer precision: how far the lower precisions it
      // allows reach (master/grads/moments, search.hpp lower_precision_variants), when further
      Plan low_plan;
      // only plans that beat s are bisected, the plan that answered s first
      const int64_t low = max_trainable_seq_lower_precision(r, hi, &low_plan, s, s > 0 ? &best : nullptr);
      if (low > s) {
        row["lower_precision"] = {{"max_seq", low}, {"plan", plan_to_string(low_plan)}};
        lower_notes += "  " + std::to_string(gpus) + (gpus == 1 ? " GPU: " : " GPUs: ") + std::to_string(low) + " tokens (" + plan_to_string(low_plan) + ")\n";
      }
      rows.push_back(row);
      t.rows.push_back(cells);
    }
    if (a->json) std::cout << json_dump(json{{"schema", "ctxplan.maxseq/1"}, {"model", job.model.name}, {"runtime", job.runtime.name}, {"rows", rows}}) << "\n";
    else {
      std::cout << "ctxplan maxseq: " << job.model.name << " on " << job.cluster.gpu.name << " nodes of " << job.cluster.gpus_per_node
                << ", runtime " << job.runtime.name << "\n" << t.render();
      if (!lower_notes.empty())
        std::cout << "With the lower optimizer precision " << job.runtime.name << " allows (master/grads/moments):\n" << lower_notes;
    }
    return g_cancel ? kExitInterrupted : kExitOk;
  };
}

std::function<int()> add_sweep_command(CLI::App& app, CommonOptions& common) {
  struct Args : SearchArgs {
    std::string seqs = "32k,64k,128k,256k,512k,1m", gpus, out;
  };
  auto a = std::make_shared<Args>();
  add_search_options(app, *a);
  app.add_option("--seqs", a->seqs, "sequence lengths (default 32k,64k,128k,256k,512k,1m)");
  app.add_option("--gpus", a->gpus, "GPU counts (default 8, 16, ... up to the cluster)");
  app.add_option("--objective", a->objective, "time or memory (default time)");
  app.add_flag("--json", a->json, "JSON instead of CSV");
  app.add_option("--out,-o", a->out, "write to this file instead of standard output");
  app.footer("Example:\n  ctxplan sweep --model Llama-3.1-8B --cluster 8x8xh100 --seqs 128k,512k,2m --gpus 8,32,64 -o grid.csv\n");
  return [a, &common]() {
    Job job = resolve_job(a->job, common);
    std::vector<int64_t> seqs = parse_list(a->seqs, "--seqs"), counts;
    if (a->gpus.empty())
      for (int64_t n = std::min<int64_t>(8, job.cluster.gpus_per_node); n <= world_size(job.cluster); n *= 2) counts.push_back(n);
    else counts = parse_gpu_counts(a->gpus);
    a->refine = 30;
    {
      SearchRequest any_seq = make_request(*a, job);
      any_seq.seq = 0;  // every sequence of --seqs: the keys are checked without one
      check_constraints(any_seq, "--plan");
    }
    std::ostringstream csv;
    csv << "seq,gpus,fits,plan,step_seconds,tokens_per_second,mfu,peak_gib\n";
    json rows = json::array();
    Progress prog("sweep");
    auto fn = prog.fn();
    size_t done = 0;
    for (int64_t s : seqs)
      for (int64_t n : counts) {
        if (!fn(static_cast<double>(done++) / static_cast<double>(seqs.size() * counts.size()))) goto out;
        {
          Job j2 = job;
          j2.seq = s;
          SearchRequest req = make_request(*a, j2);
          req.cluster = resized_cluster(job.cluster, n);
          const int64_t gpus = world_size(req.cluster);  // whole nodes: the GPUs planned on
          SearchResult r = search_plans(req);
          if (r.ranked.empty()) {
            csv << s << "," << gpus << ",0,,,,,\n";
            rows.push_back({{"seq", s}, {"gpus", gpus}, {"fits", false}});
          } else {
            const Candidate& c = r.ranked[0];
            csv << s << "," << gpus << ",1,\"" << plan_to_string(c.plan) << "\"," << c.time.step_seconds << "," << c.time.tokens_per_second << ","
                << c.time.mfu << "," << c.peak_bytes / (1024.0 * 1024 * 1024) << "\n";
            rows.push_back({{"seq", s}, {"gpus", gpus}, {"fits", true}, {"best", candidate_json(c)}});
          }
        }
      }
  out:
    std::string text = a->json ? json_dump(json{{"schema", "ctxplan.sweep/1"}, {"model", job.model.name}, {"rows", rows}}) + "\n" : csv.str();
    if (a->out.empty()) std::cout << text;
    else write_file_atomic(a->out, text);
    return g_cancel ? kExitInterrupted : kExitOk;
  };
}

std::function<int()> add_budget_command(CLI::App& app, CommonOptions& common) {
  struct Args : SearchArgs {
    std::string stages = "4k:20e9,32k:2e9,64k:1e9,128k:5e8";
  };
  auto a = std::make_shared<Args>();
  add_search_options(app, *a);
  app.add_option("--stages", a->stages, "seq:tokens,... e.g. 4k:20e9,32k:2e9,64k:1e9 (default 4k:20e9,32k:2e9,64k:1e9,128k:5e8)");
  app.add_flag("--json", a->json, "print JSON");
  app.footer("Example:\n  ctxplan budget --model Llama-3.1-8B --cluster 4x8xh100 --stages 8k:50e9,64k:5e9,256k:1e9 -g 4m\n");
  return [a, &common]() {
    Job job = resolve_job(a->job, common);
    {
      SearchRequest any_seq = make_request(*a, job);
      any_seq.seq = 0;  // every stage's sequence: the keys are checked without one
      check_constraints(any_seq, "--plan");
    }
    json rows = json::array();
    Table t;
    t.header = {"stage", "seq", "tokens", "plan", "tokens/s", "wall h", "GPU h"};
    double total_h = 0, total_gpu_h = 0;
    std::stringstream ss(a->stages);
    std::string item;
    int stage = 0;
    bool ok = true;
    while (std::getline(ss, item, ',')) {
      auto colon = item.find(':');
      if (colon == std::string::npos) throw InputError("--stages", item, "expected seq:tokens, e.g. 32k:2e9");
      Job j2 = job;
      j2.seq = parse_tokens(item.substr(0, colon), "--stages");
      double tokens = 0;
      if (!parse_scaled_number(item.substr(colon + 1), &tokens) || tokens <= 0)
        throw InputError("--stages", item, "the token count after ':' must be a positive number such as 2e9");
      SearchRequest req = make_request(*a, j2);
      req.refine = 30;
      SearchResult r = search_plans(req);
      ++stage;
      if (r.ranked.empty()) {
        ok = false;
        t.rows.push_back({std::to_string(stage), std::to_string(j2.seq), human_count(tokens), "(nothing fits)", "", "", ""});
        rows.push_back({{"stage", stage}, {"seq", j2.seq}, {"tokens", tokens}, {"fits", false}, {"no_fit", r.no_fit_reason}});
        continue;
      }
      const Candidate& c = r.ranked[0];
      double hours = tokens / c.time.tokens_per_second / 3600.0, gpu_h = hours * static_cast<double>(world_size(job.cluster));
      total_h += hours;
      total_gpu_h += gpu_h;
      t.rows.push_back({std::to_string(stage), std::to_string(j2.seq), human_count(tokens), plan_to_string(c.plan),
                        fixed(c.time.tokens_per_second, 0), fixed(hours, 1), fixed(gpu_h, 0)});
      rows.push_back({{"stage", stage}, {"seq", j2.seq}, {"tokens", tokens}, {"fits", true}, {"best", candidate_json(c)},
                      {"wall_hours", hours}, {"gpu_hours", gpu_h}});
    }
    t.rows.push_back({"total", "", "", "", "", fixed(total_h, 1), fixed(total_gpu_h, 0)});
    std::string why;  // each stage that has no plan: why (the batch, the memory, ...)
    for (auto& row : rows)
      if (!row.at("fits").get<bool>()) why += "stage " + std::to_string(row.at("stage").get<int>()) + ": " + row.at("no_fit").get<std::string>() + "\n";
    if (a->json)
      std::cout << json_dump(json{{"schema", "ctxplan.budget/1"}, {"model", job.model.name}, {"cluster", job.cluster.name}, {"stages", rows},
                        {"wall_hours", total_h}, {"gpu_hours", total_gpu_h}}) << "\n";
    else
      std::cout << "ctxplan budget: " << job.model.name << " on " << job.cluster.name << " (" << world_size(job.cluster) << " GPUs)\n"
                << t.render() << why;
    return ok ? kExitOk : kExitDoesNotFit;
  };
}

}  // namespace ctx
