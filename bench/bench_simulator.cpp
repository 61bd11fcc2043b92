// The step simulator, old (event queue, every task stored: simulate_step_reference) against new
// (one sweep in creation order: simulate_step, without and with the task recording), in one run,
// on the 128-rank plain ring of issue 15: Llama-3.1-70B on h100-superpod-1024, 1M tokens,
// tp=8,cp=128,cp_kind=ring,zero=3,recompute=full. Reports the best and median wall time of a few repetitions
// (at least 20 for the streaming sweep)
// and the peak heap of one simulation (a counting operator new: bytes live at once, above what was
// live before the call), and the ratios; beside the wall time, the simulating thread's CPU time (on
// a shared machine the wall time includes waiting for other processes). Issue 15's target: under
// 10 ms and 10 MB.
// Then the backward ring swept against in closed form (costmodel/ring_backward.hpp) on that plan and
// on the 1024-rank plain ring. Then, for issue 15's other targets on that job's search space (Llama-3.1-70B, h100-superpod-1024,
// 1M tokens): the full search with 20, 200 and 1000 simulated finalists (wall and thread CPU time; same-run
// references: 200 finalists without pipeline plans, and with every pipeline plan priced), and with
// --space every fitting plan of the space simulated once (streaming): count, total, median, p99,
// max, how many exceed 10 ms (thread CPU time), and the slowest plans (8; CTX_BENCH_SPACE_TOP=N lists N;
// CTX_BENCH_SPACE_ROWS=FILE writes every plan's CPU ms, step time and plan, for bench/compare_space_rows.py to compare two
// builds plan by plan; CTX_BENCH_SPACE_ONLY=1 skips the other rows).
// Standalone (no Google Benchmark): build/bench/bench_simulator [--space | --one] [model cluster seq plan [reps]]
// (--one: only the streaming sweep of that plan, with its periodicity statistics, and the same
// without the margins' guess of where a line ends, as a ratio: for profiles;
// CTX_BENCH_CLOSED_FORM_MIN and CTX_BENCH_PARTIAL_MIN set simulate_step's two rank thresholds;
// CTX_BENCH_LAYERS=1 adds one simulation's layer iterations: kind, CPU time, ranks).
#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <unordered_set>
#include <vector>

#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/simulator.hpp"
#include "costmodel/step_model.hpp"
#include "costmodel/memory_model.hpp"
#include "planner/search.hpp"

// ---- counting allocator -------------------------------------------------------------------------
namespace {
std::atomic<int64_t> g_live{0}, g_peak{0};
void* counted(void* p) {
  if (!p) throw std::bad_alloc();
  int64_t now = g_live.fetch_add(static_cast<int64_t>(malloc_usable_size(p))) + static_cast<int64_t>(malloc_usable_size(p));
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
  return p;
}
void uncounted(void* p) {
  if (!p) return;
  g_live.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)));
  std::free(p);
}
void* aligned(std::size_t n, std::align_val_t a) {
  std::size_t al = static_cast<std::size_t>(a);
  return std::aligned_alloc(al, (std::max<std::size_t>(n, 1) + al - 1) / al * al);
}
}  // namespace

void* operator new(std::size_t n) { return counted(std::malloc(std::max<std::size_t>(n, 1))); }
void* operator new[](std::size_t n) { return counted(std::malloc(std::max<std::size_t>(n, 1))); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(aligned(n, a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(aligned(n, a)); }
void operator delete(void* p) noexcept { uncounted(p); }
void operator delete[](void* p) noexcept { uncounted(p); }
void operator delete(void* p, std::size_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::size_t) noexcept { uncounted(p); }
void operator delete(void* p, std::align_val_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::align_val_t) noexcept { uncounted(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { uncounted(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { uncounted(p); }

namespace {

struct Measure {
  int reps = 0;
  double best_ms = 1e300;
  double best_cpu_ms = 1e300;  // the simulating thread's CPU time (the machine is shared: wall time waits for others)
  double median_ms = 0, median_cpu_ms = 0;
  double peak_mb = 0;
  double step = 0;
  int64_t tasks = 0;
  int64_t extrapolated = 0;
};

double thread_cpu_ms() { return ctx::thread_cpu_seconds() * 1e3; }

template <class F>
Measure measure(int reps, F&& simulate) {
  Measure m;
  m.reps = reps;
  std::vector<double> wall, cpu;
  for (int i = 0; i < reps; ++i) {
    const int64_t before = g_live.load();
    g_peak.store(before);
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_ms();
    ctx::SimResult r = simulate();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    cpu.push_back(thread_cpu_ms() - c0);
    wall.push_back(ms);
    m.best_cpu_ms = std::min(m.best_cpu_ms, cpu.back());
    m.best_ms = std::min(m.best_ms, ms);
    m.peak_mb = std::max(m.peak_mb, static_cast<double>(g_peak.load() - before) / (1 << 20));
    m.step = r.time.step_seconds;
    m.tasks = r.stats.tasks;
    m.extrapolated = r.stats.layers_extrapolated;
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  m.median_ms = wall[wall.size() / 2];
  m.median_cpu_ms = cpu[cpu.size() / 2];
  return m;
}

double maxrss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

}  // namespace

// The search for the job with `refine` simulated finalists: wall seconds, plans, fitting, simulated.
void search_row(const ctx::SearchRequest& base, int refine, const char* label = "") {
  ctx::SearchRequest req = base;
  req.refine = refine;
  double best = 1e300, best_cpu_s = 1e300;  // (the search runs on the calling thread: its CPU time is the search's)
  ctx::SearchResult r;
  for (int i = 0; i < 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_ms();
    r = ctx::search_plans(req);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    best_cpu_s = std::min(best_cpu_s, (thread_cpu_ms() - c0) / 1e3);
  }
  std::printf("  search%s, %4d finalists simulated: %8.3f s (%.3f s CPU)  (%lld plans, %lld valid, %lld fit, %zu unpriced, %lld simulated; best %s)\n",
              label, refine, best, best_cpu_s, static_cast<long long>(r.enumerated), static_cast<long long>(r.valid), static_cast<long long>(r.fitting),
              r.unpriced.size(), static_cast<long long>(r.simulated), r.ranked.empty() ? "none" : ctx::plan_to_string(r.ranked[0].plan).c_str());
}

// Every fitting plan of the search space, simulated once each without a recording.
void space_rows(const ctx::SearchRequest& req) {
  struct Row {
    double ms;       // the simulating thread's CPU time (wall time on the shared machine includes waiting)
    double wall_ms;
    std::string plan;
    int64_t tasks, extrapolated;
    double step;
  };
  std::vector<Row> rows;
  double total = 0;
  int64_t probes_failed = 0, guessed = 0, guesses_failed = 0;  // Period::jump's, summed
  for (ctx::Plan p : ctx::enumerate_plans(req)) {
    if (!ctx::check_plan(p, req.model, req.cluster, req.seq).ok()) continue;
    if (!ctx::predict_memory(req.model, req.cluster, req.runtime, p, req.seq).fits()) continue;
    const ctx::StepCosts k = ctx::step_costs(req.model, req.cluster, req.runtime, p, req.seq, true);
    auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_ms();
    ctx::SimResult r = ctx::simulate_step(k, p, ctx::SimRecord::none);
    const double ms = thread_cpu_ms() - c0;
    const double wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    total += ms;
    probes_failed += r.stats.jump_misses, guessed += r.stats.kinks_predicted, guesses_failed += r.stats.kink_misses;
    rows.push_back({ms, wall_ms, ctx::plan_to_string(p), r.stats.tasks, r.stats.layers_extrapolated, r.time.step_seconds});
    if (rows.size() % 2000 == 0) std::fprintf(stderr, "  ... %zu plans simulated, %.1f s\n", rows.size(), total / 1e3);
  }
  // CTX_BENCH_SPACE_ROWS=FILE: every plan's CPU time and step time (to compare two builds plan by plan)
  if (const char* path = std::getenv("CTX_BENCH_SPACE_ROWS")) {
    if (FILE* f = std::fopen(path, "w")) {
      for (const Row& r : rows) std::fprintf(f, "%.4f\t%.17g\t%lld\t%s\n", r.ms, r.step, static_cast<long long>(r.extrapolated), r.plan.c_str());
      std::fclose(f);
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  if (rows.empty()) return;
  size_t over = 0;
  for (const Row& r : rows) over += r.ms > 10.0;
  std::printf("  search space: %zu fitting plans simulated once each in %.2f s of CPU time; CPU median %.3f ms, p99 %.2f ms, max %.1f ms; %zu over 10 ms\n",
              rows.size(), total / 1e3, rows[rows.size() / 2].ms, rows[rows.size() / 100].ms, rows[0].ms, over);
  std::printf("  jumps: %lld checks failed; %lld jumps checked first where the margins put a line's end, %lld of those failed\n",
              static_cast<long long>(probes_failed), static_cast<long long>(guessed), static_cast<long long>(guesses_failed));
  // Where the plans over 10 ms stand in the search: how many of them the search simulates as
  // finalists (at the default 200 and at 1000), and the best rank any of them reaches among the
  // fitting plans (the search's order: tokens per second, closed form, its finalists simulated).
  {
    std::unordered_set<std::string> slow;
    for (const Row& r : rows)
      if (r.ms > 10.0) slow.insert(r.plan);
    for (int refine : {200, 1000}) {
      ctx::SearchRequest sr = req;
      sr.refine = refine;
      const ctx::SearchResult res = ctx::search_plans(sr);
      int64_t finalists = 0, best_rank = -1;
      double best_rate = 0;
      for (size_t i = 0; i < res.ranked.size(); ++i) {
        const ctx::Candidate& c = res.ranked[i];
        if (!slow.count(ctx::plan_to_string(c.plan))) continue;
        finalists += c.simulated;
        if (best_rank < 0) best_rank = static_cast<int64_t>(i) + 1, best_rate = c.time.tokens_per_second;
      }
      std::printf("  the %zu plans over 10 ms in the search with %d finalists: %lld of them simulated as finalists; the best of them ranks %lld of %zu "
                  "(%.0f tokens/s; the best plan %.0f)\n",
                  slow.size(), refine, static_cast<long long>(finalists), static_cast<long long>(best_rank), res.ranked.size(), best_rate,
                  res.ranked.empty() ? 0.0 : res.ranked[0].time.tokens_per_second);
    }
  }
  const char* top = std::getenv("CTX_BENCH_SPACE_TOP");  // how many of the slowest plans to list (default 8)
  const size_t shown = top ? static_cast<size_t>(std::max(0, std::atoi(top))) : 8;
  for (size_t i = 0; i < rows.size() && i < shown; ++i)
    std::printf("    %9.1f ms CPU (%.1f wall)  %s  (%lld tasks, %lld layer iterations extrapolated)\n", rows[i].ms, rows[i].wall_ms, rows[i].plan.c_str(),
                static_cast<long long>(rows[i].tasks), static_cast<long long>(rows[i].extrapolated));
}

// CTX_BENCH_LAYERS=1 with --one: where one simulation's time went, layer iteration by layer
// iteration (simulate_step's SimProfile), then summed per loop and kind; what is left of the
// simulation's CPU time ran between the iterations (Period's snapshots and checks, the loss, the
// optimizer).
void layer_profile(const ctx::StepCosts& k, const ctx::Plan& p, int cf_min, int partial_min) {
  ctx::SimProfile prof;
  const double c0 = thread_cpu_ms();
  ctx::simulate_step(k, p, ctx::SimRecord::none, cf_min, partial_min, true, &prof);
  const double total_ms = thread_cpu_ms() - c0;
  static const char* kinds[] = {"swept", "probe", "partial"};
  auto loop = [](ctx::SimPass pass) { return pass == ctx::SimPass::forward ? "forward" : "backward"; };
  std::printf("  layer iterations of one simulation (%zu; thread CPU time; the backward ring's ranks computed in closed form and moved from\n"
              "  the layer before, and * where the closed form gave way to the sweep):\n    %-8s %3s %5s %-7s %9s %7s %9s %7s\n",
              prof.runs.size(), "loop", "mb", "layer", "kind", "ms", "ranks", "computed", "moved");
  for (const ctx::SimLayerRun& x : prof.runs)
    std::printf("    %-8s %3lld %5d %-7s %9.3f %7lld %9lld %7lld%s\n", loop(x.pass), static_cast<long long>(x.micro_batch), x.layer, kinds[x.kind],
                x.cpu_s * 1e3, static_cast<long long>(x.swept_ranks), static_cast<long long>(x.ring_computed), static_cast<long long>(x.ring_moved),
                x.ring_gave_way ? " *" : "");
  double in_runs_ms = 0;
  for (ctx::SimPass pass : {ctx::SimPass::forward, ctx::SimPass::backward})
    for (int kind = 0; kind < 3; ++kind) {
      int n = 0;
      double ms = 0;
      int64_t computed = 0;
      for (const ctx::SimLayerRun& x : prof.runs)
        if (x.pass == pass && x.kind == kind) ++n, ms += x.cpu_s * 1e3, computed += x.ring_computed;
      if (n == 0) continue;
      in_runs_ms += ms;
      std::printf("  %-8s %-7s %4d iterations %8.2f ms (%.3f ms each; %lld backward ring ranks computed in closed form)\n", loop(pass), kinds[kind], n, ms,
                  ms / n, static_cast<long long>(computed));
    }
  std::printf("  between the iterations (snapshots and checks, loss, optimizer): %.2f of %.2f ms\n", total_ms - in_runs_ms, total_ms);
}

int main(int argc, char** argv) {
  bool space = false, one = false;
  if (argc >= 2 && std::string(argv[1]) == "--space") {
    space = true;
    --argc;
    ++argv;
  } else if (argc >= 2 && std::string(argv[1]) == "--one") {  // the streaming sweep only (for profiles)
    one = true;
    --argc;
    ++argv;
  }
  std::string model = "Llama-3.1-70B", cluster = "h100-superpod-1024", plan_text = "tp=8,cp=128,cp_kind=ring,zero=3,recompute=full";
  int64_t seq = 1048576;
  int reps = 3;
  if (argc >= 5) {
    model = argv[1];
    cluster = argv[2];
    seq = std::atoll(argv[3]);
    plan_text = argv[4];
  }
  if (argc >= 6) reps = std::max(1, std::atoi(argv[5]));
  const ctx::Profiles profiles = ctx::load_profiles(ctx::default_profiles_dir());
  ctx::ModelSpec m = ctx::resolve_model(profiles, model);
  ctx::ClusterSpec cl = ctx::resolve_cluster(profiles, cluster);
  const ctx::RuntimeProfile& rt = ctx::resolve_runtime(profiles, "ctxrun-cuda");
  ctx::Plan p = ctx::parse_plan(plan_text);
  ctx::PlanCheck chk = ctx::check_plan(p, m, cl, seq);
  if (!chk.ok()) {
    std::fprintf(stderr, "invalid plan: %s\n", chk.message().c_str());
    return 2;
  }
  const ctx::StepCosts k = ctx::step_costs(m, cl, rt, p, seq, true);
  std::printf("%s on %s, seq %lld, %s (%d repetitions, best time; peak heap of one simulation)\n", model.c_str(), cluster.c_str(),
              static_cast<long long>(seq), plan_text.c_str(), reps);
  if (space && std::getenv("CTX_BENCH_SPACE_ONLY")) {  // the space rows alone (the job of the search rows below)
    ctx::SearchRequest req;
    req.model = ctx::resolve_model(profiles, "Llama-3.1-70B");
    req.cluster = ctx::resolve_cluster(profiles, "h100-superpod-1024");
    req.runtime = rt;
    req.seq = 1048576;
    space_rows(req);
    return 0;
  }
  if (one) {
    const char* cf = std::getenv("CTX_BENCH_CLOSED_FORM_MIN");  // the backward ring's closed form from this many ranks
    const int cf_min = cf ? std::atoi(cf) : ctx::kRingClosedFormMinRanks;
    const char* pm = std::getenv("CTX_BENCH_PARTIAL_MIN");  // the forward's partial sweep from this many ranks (huge: never)
    const int partial_min = pm ? std::atoi(pm) : ctx::kPartialSweepMinRanks;
    Measure x = measure(reps, [&] { return ctx::simulate_step(k, p, ctx::SimRecord::none, cf_min, partial_min); });
    const ctx::SimResult r = ctx::simulate_step(k, p, ctx::SimRecord::none, cf_min, partial_min);
    // the same without the margins' guess of where a line ends (Period's search alone), same run
    Measure y = measure(reps, [&] { return ctx::simulate_step(k, p, ctx::SimRecord::none, cf_min, partial_min, false); });
    const ctx::SimResult r0 = ctx::simulate_step(k, p, ctx::SimRecord::none, cf_min, partial_min, false);
    std::printf("  streaming: best %.2f ms CPU (median %.2f ms CPU, %.2f ms wall), step %.17g s; %lld tasks, %lld jumps, %lld layer iterations "
                "extrapolated, %lld jump misses (%lld first at the farthest distance, %lld jumps first where the margins put a line's end, %lld of them missed); %lld partial jumps over %lld layer iterations (%lld ranks swept in them), %lld undone\n",
                x.best_cpu_ms, x.median_cpu_ms, x.median_ms, x.step, static_cast<long long>(x.tasks), static_cast<long long>(r.stats.periodic_jumps),
                static_cast<long long>(r.stats.layers_extrapolated), static_cast<long long>(r.stats.jump_misses),
                static_cast<long long>(r.stats.far_first_misses), static_cast<long long>(r.stats.kinks_predicted),
                static_cast<long long>(r.stats.kink_misses), static_cast<long long>(r.stats.partial_jumps), static_cast<long long>(r.stats.layers_partially_swept),
                static_cast<long long>(r.stats.partial_rank_layers),
                static_cast<long long>(r.stats.partial_misses));
    std::printf("  without the margins' guess: best %.2f ms CPU (median %.2f ms CPU; guess/search %.2f), step %.17g s; %lld jumps, %lld layer iterations "
                "extrapolated, %lld jump misses\n",
                y.best_cpu_ms, y.median_cpu_ms, x.best_cpu_ms / y.best_cpu_ms, y.step, static_cast<long long>(r0.stats.periodic_jumps),
                static_cast<long long>(r0.stats.layers_extrapolated), static_cast<long long>(r0.stats.jump_misses));
    if (std::getenv("CTX_BENCH_LAYERS")) layer_profile(k, p, cf_min, partial_min);
    const auto& b = r.time.breakdown;
    std::printf("  breakdown (rep %d): compute %.17g exposed %.17g offload %.17g imbalance %.17g optimizer %.17g; phases %.17g %.17g %.17g\n",
                r.breakdown_rep, b.compute, b.exposed_comm, b.offload_stall, b.imbalance, b.optimizer, r.time.phase_seconds[0], r.time.phase_seconds[1],
                r.time.phase_seconds[2]);
    return 0;
  }
  // new first, so that the process's maxrss after it is the new implementation's; the streaming
  // sweep (milliseconds) is repeated at least 20 times, the seconds-long ones `reps` times
  Measure sweep = measure(std::max(reps, 20), [&] { return ctx::simulate_step(k, p, ctx::SimRecord::none); });
  const double rss_after_new = maxrss_mb();
  Measure recording = measure(reps, [&] { return ctx::simulate_step(k, p, ctx::SimRecord::tasks); });
  Measure old = measure(reps, [&] { return ctx::simulate_step_reference(k, p); });
  auto row = [&](const char* name, const Measure& x) {
    std::printf("  %-40s %10.2f ms (%.2f ms CPU; median of %d: %.2f ms, %.2f ms CPU) %10.2f MB  step %.12g s  %lld tasks (%lld layer iterations extrapolated)\n",
                name, x.best_ms, x.best_cpu_ms, x.reps, x.median_ms, x.median_cpu_ms, x.peak_mb, x.step, static_cast<long long>(x.tasks),
                static_cast<long long>(x.extrapolated));
  };
  row("old (event queue, simulate_step_reference)", old);
  row("new, recording the tasks", recording);
  row("new, streaming (SimRecord::none)", sweep);
  std::printf("  speed-up streaming %.1fx (CPU %.1fx), recording %.1fx; memory streaming %.0fx less\n", old.best_ms / sweep.best_ms,
              old.best_cpu_ms / sweep.best_cpu_ms, old.best_ms / recording.best_ms, old.peak_mb / std::max(1e-6, sweep.peak_mb));
  std::printf("  maxrss: %.1f MB after the streaming runs (profiles loaded), %.1f MB at the end\n", rss_after_new, maxrss_mb());
  // the recording sweeps every task (bit-identical to the oracle); the streaming sweep extrapolates
  // periodic layers (equal up to rounding: tests/test_simulator_oracle.cpp holds it to 1e-9)
  const double rel = std::abs(sweep.step - old.step) / old.step;
  std::printf("  step time: streaming vs old relative difference %.2e\n", rel);
  if (old.step != recording.step || rel > 1e-9) {
    std::printf("  MISMATCH: step times differ\n");
    return 1;
  }
  // the backward ring swept over its steps against rank by rank in closed form (ring_backward.hpp),
  // streaming, on this plan and on the slowest plan of the 1024-GPU space (the 1024-rank plain
  // ring; the event queue would hold its 588 million tasks, ~100 GB, so it has no old row)
  auto closed_form_rows = [&](const ctx::StepCosts& kk, const ctx::Plan& pp, const std::string& what) {
    Measure swept = measure(reps, [&] { return ctx::simulate_step(kk, pp, ctx::SimRecord::none, 1 << 30); });
    Measure closed = measure(reps, [&] { return ctx::simulate_step(kk, pp, ctx::SimRecord::none, 2); });
    std::printf("  %s: backward ring swept %.2f ms (%.2f CPU), closed form %.2f ms (%.2f CPU) (%.2fx CPU; default from %d ranks); step %.12g vs %.12g s\n",
                what.c_str(), swept.best_ms, swept.best_cpu_ms, closed.best_ms, closed.best_cpu_ms, swept.best_cpu_ms / closed.best_cpu_ms,
                ctx::kRingClosedFormMinRanks, swept.step, closed.step);
  };
  closed_form_rows(k, p, plan_text);
  {
    const ctx::Plan p1024 = ctx::parse_plan("cp=1024,cp_kind=ring,zero=3,recompute=full");
    const ctx::StepCosts k1024 = ctx::step_costs(ctx::resolve_model(profiles, "Llama-3.1-70B"), ctx::resolve_cluster(profiles, "h100-superpod-1024"),
                                                 rt, p1024, 1048576, true);
    closed_form_rows(k1024, p1024, "Llama-3.1-70B h100-superpod-1024 1M cp=1024,cp_kind=ring,zero=3,recompute=full");
  }
  // issue 15's search targets, on the job of the search benchmarks
  ctx::SearchRequest req;
  req.model = ctx::resolve_model(profiles, "Llama-3.1-70B");
  req.cluster = ctx::resolve_cluster(profiles, "h100-superpod-1024");
  req.runtime = rt;
  req.seq = 1048576;
  std::printf("Llama-3.1-70B on h100-superpod-1024, seq 1048576 (target: 200 finalists under 1 s)\n");
  search_row(req, 20);
  search_row(req, 200);
  search_row(req, 1000);  // how far the finalist set can grow
  // same-run references (the machine is shared): without pipeline plans, and every pipeline plan priced
  ctx::SearchRequest no_pp = req;
  no_pp.pp_values = {1};
  search_row(no_pp, 200, " without pp");
  ctx::SearchRequest unpruned = req;
  unpruned.prune_pipeline = false;
  search_row(unpruned, 200, " pp unpruned");
  if (space) space_rows(req);
  return 0;
}
