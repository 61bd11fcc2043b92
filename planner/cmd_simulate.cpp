// `ctxplan simulate`: one plan through the discrete-event simulator: step time, per-phase and
// per-cause breakdown, each simulated rank, and a Chrome trace (Perfetto) of every stream.
#include <iostream>

#include "costmodel/prediction.hpp"
#include "planner/commands.hpp"
#include "costmodel/exit_codes.hpp"
#include "planner/format.hpp"
#include "planner/job_args.hpp"

namespace ctx {

std::function<int()> add_simulate_command(CLI::App& app, CommonOptions& common) {
  struct Args {
    JobArgs job;
    std::string trace;
    bool json = false;
  };
  auto a = std::make_shared<Args>();
  add_job_options(app, a->job, true);
  app.add_option("--trace,-t", a->trace, "write a Chrome-trace JSON (open in https://ui.perfetto.dev or chrome://tracing)");
  app.add_flag("--json", a->json, "print the Prediction (memory and simulated time) as JSON");
  app.footer(
      "Examples:\n"
      "  ctxplan simulate --trace step.json\n"
      "  ctxplan simulate --seq 256k --plan \"cp=8,cp_kind=ring,zero=3,recompute=full\" --trace ring.json\n"
      "Exit codes: 0 fits, 3 does not fit (still simulated), 2 bad input.");
  return [a, &common]() {
    Job job = resolve_job(a->job, common);
    SimResult sim;
    // every task is kept only for the trace; the tables come from the per-rank totals. A trace is
    // bounded: the streaming sweep counts the tasks first (it is cheap), and a step with more than
    // kMaxTraceTasks (about 200 bytes each while recording, and more in the JSON) is refused.
    constexpr int64_t kMaxTraceTasks = 10'000'000;
    Prediction p = predict(job.model, job.cluster, job.runtime, job.plan, job.seq, &sim, SimRecord::none);
    if (!a->trace.empty()) {
      if (sim.stats.tasks > kMaxTraceTasks)
        throw InputError("--trace", a->trace,
                         "this step has " + std::to_string(sim.stats.tasks) + " tasks; a trace holds at most " + std::to_string(kMaxTraceTasks) +
                             " (about 2 GB while recording): trace fewer micro-batches (ga), layers or CP ranks, or drop --trace (the "
                             "simulation itself needs no trace)");
      p = predict(job.model, job.cluster, job.runtime, job.plan, job.seq, &sim, SimRecord::tasks);
    }
    if (!a->trace.empty()) {
      std::string title = job.model.name + " on " + job.cluster.name + ", seq " + std::to_string(job.seq) + ", " + plan_to_string(p.plan);
      write_file_atomic(a->trace, chrome_trace(sim, title).dump() + "\n");
    }
    if (a->json) {
      json j = prediction_to_json(p);
      j["simulation"] = {{"tasks", sim.stats.tasks},
                         {"events", sim.stats.events},
                         {"wall_seconds", sim.stats.wall_seconds},
                         {"simulated_ranks", sim.reps.size()},
                         {"layers_extrapolated", sim.stats.layers_extrapolated},
                         {"micro_batches_extrapolated", sim.stats.micro_batches_extrapolated}};
      std::cout << j.dump(2) << "\n";
      return p.memory.fits() ? kExitOk : kExitDoesNotFit;
    }
    const StepTime& t = p.time;
    std::cout << "ctxplan simulate: " << p.model << " on " << p.cluster << " (" << p.world << " x " << p.gpu << "), seq " << p.seq
              << " tokens, runtime " << p.runtime << " (attention kernel " << p.attention << ")\n";
    std::cout << "plan: " << plan_to_string(p.plan) << "\n";
    if (p.pad_tokens > 0)  // (as predict says it)
      std::cout << "padded: " << p.pad_tokens << " pad tokens per sequence, memory and time priced at " << p.seq + p.pad_tokens
                << " tokens; tokens/s counts the " << p.seq << " real ones\n";
    std::cout << "\n";
    Table tt;
    tt.header = {"", "seconds", "share"};
    auto row = [&](const char* n, double v) { tt.rows.push_back({n, fixed(v, 4), fixed(100.0 * v / t.step_seconds, 1) + "%"}); };
    row("compute", t.breakdown.compute);
    row("exposed communication", t.breakdown.exposed_comm);
    row("offload stalls", t.breakdown.offload_stall);
    row("imbalance bubble", t.breakdown.imbalance);
    row("optimizer", t.breakdown.optimizer);
    row("step", t.step_seconds);
    // pp > 1: the stages are simulated one by one and scheduled (pipeline_time.hpp); no rank list
    const std::string on = sim.reps.empty() ? "pipeline stage " + p.pipeline.value("critical_stage", json(0)).dump() + ", finishing last"
                                            : sim.reps[static_cast<size_t>(sim.breakdown_rep)].label;
    std::cout << "Where the step goes (on " << on << "):\n" << tt.render();
    std::cout << "\nPhases (slowest rank): forward " << fixed(t.phase_seconds[0], 4) << " s, backward " << fixed(t.phase_seconds[1], 4)
              << " s, optimizer " << fixed(t.phase_seconds[2], 4) << " s\n";
    std::cout << "Throughput: " << fixed(t.tokens_per_second, 0) << " tokens/s, MFU " << fixed(100 * t.mfu, 1) << "%, "
              << fixed(t.model_tflops_per_gpu, 0) << " model TFLOP/s per GPU (" << fixed(t.hardware_tflops_per_gpu, 0)
              << " as run, recompute included)\n";
    std::cout << "Closed-form estimate (used by the search): " << fixed(p.time_closed_form.step_seconds, 4) << " s\n\n";
    Table rt;
    rt.header = {"simulated rank", "stands for", "compute busy s", "finishes s"};
    for (size_t i = 0; i < sim.reps.size() && i < 64; ++i)
      rt.rows.push_back({sim.reps[i].label, std::to_string(sim.reps[i].stands_for), fixed(sim.reps[i].compute_stream_busy_s, 4), fixed(sim.reps[i].end_s, 4)});
    std::cout << rt.render();
    if (sim.reps.size() > 64) std::cout << "  ... " << sim.reps.size() - 64 << " more\n";
    std::cout << "\nSimulated " << sim.stats.tasks << " tasks (" << sim.stats.events << " events) in " << fixed(sim.stats.wall_seconds * 1e3, 1)
              << " ms";
    if (sim.stats.layers_extrapolated > 0 || sim.stats.micro_batches_extrapolated > 0)
      std::cout << " (not swept, taken on the line of the iterations before them: " << sim.stats.layers_extrapolated
                << " layer iterations, " << sim.stats.micro_batches_extrapolated << " micro-batches)";
    std::cout << ".";
    if (!a->trace.empty()) std::cout << " Trace: " << a->trace << " (one process per rank, one thread per stream)";
    std::cout << "\n";
    if (!p.memory.fits()) std::cout << "\nwarning: the plan does not fit in memory (see `ctxplan predict`)\n";
    return p.memory.fits() ? kExitOk : kExitDoesNotFit;
  };
}

}  // namespace ctx
