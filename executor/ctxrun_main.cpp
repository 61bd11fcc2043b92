// ctxrun: trains a Llama-style model under a ctxplan plan and measures time and memory in the
// cost model's categories. Launched by mpirun/srun (one process per rank) or alone (one rank).
//   mpirun -np 4 ctxrun --model tiny --seq 256 --steps 20 --plan "tp=2,cp=2,cp_kind=zigzag" --report run.json
// Exit codes: 0 done, 1 internal error, 2 bad input, 3 the memory model says the plan does not fit,
// 4 diverged (non-finite loss; the step and first layer are named), 130 interrupted (checkpoint saved).
#include <algorithm>
#include <CLI/CLI.hpp>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "costmodel/errors.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/prediction.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_capabilities.hpp"
#ifdef CTXPLAN_HAVE_CUDA
#include "executor/cuda/cuda_backend.hpp"
#ifdef CTXPLAN_HAVE_CUDA_EMULATED
#include "executor/cuda/emulated/cuda_emulated.hpp"
#endif
#endif
#include "executor/checkpoint.hpp"
#include "executor/report.hpp"
#include "executor/rope.hpp"
#include "executor/trainer.hpp"
#include "costmodel/exit_codes.hpp"

using namespace ctx;
using namespace ctx::exec;

namespace {
std::atomic<int> g_stop{0};
extern "C" void on_signal(int) { g_stop.store(1); }

struct Options {
  std::string profiles, model = "tiny", seq = "256", plan, plan_file, cluster, data, report, ckpt_dir, init_from;
  std::string debug_nan, debug_fail, schedule_trace;
  std::string export_hf;
  std::string backend = "cpu";
  int64_t steps = 20, save_every = 0, log_every = 1, schedule_steps = 0;
  bool resume = false, sorted_packing = false, no_fit_check = false;
  uint64_t seed = 1234, data_seed = 4321;
  OptimizerConfig opt;
};

int64_t parse_count(const std::string& text, const std::string& where) {
  double v = 0;
  if (text.find_first_of("eE") != std::string::npos || !parse_scaled_number(text, &v) || v < 1 || v > 1e12 ||
      v != std::floor(v))
    throw InputError(where, "", "expected a positive token count such as 256, 4k or 1m, got '" + text + "'");
  return static_cast<int64_t>(v);
}

int run(int argc, char** argv, CommWorld& world) {
  const int rank = world.world().rank(), nranks = world.world().size();
  Options o;
  o.opt.warmup = 5;
  CLI::App app{"ctxrun: train a Llama-style model under a ctxplan plan and measure time and memory per category"};
  app.add_option("--profiles", o.profiles, "profiles folder (default: $CTXPLAN_PROFILES or the source tree's)");
  auto* model_opt = app.add_option("--model,-m", o.model, "model profile name, profile JSON or HF config.json (default tiny)");
  auto* seq_opt = app.add_option("--seq,-s", o.seq, "tokens per sequence (default 256)");
  app.add_option("--plan,-p", o.plan, "plan as key=value,... (see ctxplan --help); dp defaults to fill the ranks");
  app.add_option("--plan-file", o.plan_file, "plan.json (schema ctxplan.plan/1; may carry model and seq)");
  app.add_option("--cluster,-c", o.cluster,
                 "cluster for the memory check (default 1x<ranks>xh100: refuses plans the memory model says do not fit)");
  app.add_option("--steps,-n", o.steps, "optimizer steps to run in total (default 20)");
  app.add_option("--data", o.data, "llm.c token file (.bin, uint16); default: built-in synthetic key-recall documents");
  app.add_flag("--sorted-packing", o.sorted_packing, "balance attention work (sum of len^2) across data-parallel ranks");
  app.add_option("--lr", o.opt.lr, "peak learning rate (default 3e-3)");
  app.add_option("--min-lr", o.opt.min_lr, "final learning rate of the cosine (default 3e-4)");
  app.add_option("--warmup", o.opt.warmup, "linear warm-up steps (default 5)");
  app.add_option("--schedule-steps", o.schedule_steps,
                 "length of the warm-up + cosine schedule (default --steps; keep it fixed across --resume runs)");
  app.add_option("--clip", o.opt.clip, "max global gradient norm, 0 = off (default 1)");
  app.add_option("--weight-decay", o.opt.weight_decay, "AdamW decoupled weight decay on matrices (default 0.1)");
  app.add_option("--seed", o.seed, "parameter initialisation seed");
  app.add_option("--data-seed", o.data_seed, "synthetic data seed");
  app.add_option("--report", o.report, "write the Measurement (Prediction schema's shape + losses) to this JSON file");
  app.add_option("--ckpt-dir", o.ckpt_dir, "checkpoint folder (one safetensors shard per rank + trainer.json per step); Ctrl-C saves here");
  app.add_option("--save-every", o.save_every, "save a checkpoint every N steps (and at the end)");
  app.add_flag("--resume", o.resume, "continue bit-exactly from <ckpt-dir>/latest");
  app.add_option("--export-hf", o.export_hf,
                 "after training, write the final weights as a Hugging Face folder (config.json + model.safetensors)");
  app.add_option("--init-from", o.init_from, "Hugging Face Llama-family folder (config.json + *.safetensors) to start from");
  app.add_option("--log-every", o.log_every, "print every N steps (default 1)");
  app.add_flag("--no-fit-check", o.no_fit_check, "run even when the memory model predicts the plan does not fit");
  app.add_option("--debug-nan", o.debug_nan, "fault injection for tests: STEP:LAYER poisons that layer's output");
  app.add_option("--backend", o.backend,
                 "cpu (Eigen reference; bf16 stored, fp32 arithmetic) | cpu-guarded (tensor memory unreadable by the "
                 "host outside the backend) | cpu-deferred (every op and message on a worker thread) | cuda (first "
                 "run on an H200 on 2026-11-28, docs/GPU_PROOF.md) | cuda-emulated (the CUDA backend's host code and kernels on CPU test doubles of "
                 "the CUDA runtime, cuBLASLt and NCCL: slow, for tests)")
      ->check(CLI::IsMember({"cpu", "cpu-guarded", "cpu-deferred", "cuda", "cuda-emulated"}));
  app.add_option("--schedule-trace", o.schedule_trace,
                 "write rank 0's first-step schedule (tasks per stream in the simulator's names) to this JSON file");
  app.add_option("--debug-fail", o.debug_fail, "fault injection for tests: RANK:STEP fails that rank at that step");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    if (rank == 0) app.exit(e);
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    if (rank == 0) std::cerr << "ctxrun: " << e.what() << "\n(run with --help for usage)\n";
    return kExitBadInput;
  }
  Profiles prof = load_profiles(o.profiles.empty() ? default_profiles_dir() : o.profiles);
  Plan plan;
  std::string model_arg = o.model, seq_arg = o.seq;
  if (!o.plan_file.empty()) {
    if (!o.plan.empty()) throw InputError("--plan", "", "give either --plan or --plan-file, not both");
    json j = read_json_file(o.plan_file);
    JsonReader r(j, o.plan_file);
    std::string schema = r.string_or("schema", "");
    if (schema != "ctxplan.plan/1") r.fail("schema", "expected \"ctxplan.plan/1\", got \"" + schema + "\"");
    plan = plan_from_json(r.raw("plan"), o.plan_file);
    if (r.has("model") && model_opt->count() == 0) model_arg = r.string("model");
    if (r.has("seq") && seq_opt->count() == 0) seq_arg = std::to_string(r.integer_in("seq", 1, int64_t(1) << 34));
  } else {
    plan = parse_plan(o.plan.empty() ? "tp=1" : o.plan, "--plan");
  }
  // --init-from without --model: the model is the checkpoint's own config.json
  if (!o.init_from.empty() && model_opt->count() == 0 && std::filesystem::exists(o.init_from + "/config.json"))
    model_arg = o.init_from + "/config.json";
  ModelSpec model = resolve_model(prof, model_arg);
  const int64_t seq = parse_count(seq_arg, "--seq");
  ClusterSpec cluster = o.cluster.empty() ? make_cluster(resolve_hardware(prof, "h100"), 1, nranks)
                                          : resolve_cluster(prof, o.cluster);
  if (world_size(cluster) != nranks)
    throw InputError("--cluster", "", cluster.name + " has " + std::to_string(world_size(cluster)) +
                                          " GPUs but ctxrun was launched with " + std::to_string(nranks) +
                                          " ranks (mpirun -np " + std::to_string(world_size(cluster)) + ")");
  PlanCheck chk = check_plan(plan, model, cluster, seq);
  // ctxrun does not pad (executor_plan_problem): pad=1 is no way out here
  chk.alternatives.erase(std::remove(chk.alternatives.begin(), chk.alternatives.end(), "pad=1"), chk.alternatives.end());
  if (!chk.ok())
    throw InputError(o.plan_file.empty() ? "--plan" : o.plan_file, "",
                     "the plan cannot run on " + std::to_string(nranks) + " ranks at " + std::to_string(seq) +
                         " tokens: " + chk.message());
  std::string why = executor_plan_problem(model, plan, seq);
  if (!why.empty()) throw InputError(o.plan_file.empty() ? "--plan" : o.plan_file, "", why);
  if (o.steps < 0) throw InputError("--steps", "", "must be >= 0");
  if (o.opt.lr <= 0 || !(o.opt.lr < 10)) throw InputError("--lr", "", "must be in (0, 10)");
  // the fit check prices the runtime this backend really is (its profile, at the plan's precision)
  const std::string runtime_name = ctxrun_runtime_for_backend(o.backend);
  const RuntimeProfile runtime = resolve_runtime(prof, runtime_name);
  // the backend's own profile states what ctxrun runs (ctxplan proposes only those plans); test_schedule's
  // CtxrunProfilesAllowExactlyWhatTheExecutorRuns keeps it and executor_plan_problem one statement
  if (std::string missing = missing_capability(runtime.capabilities, runtime_name, plan); !missing.empty())
    throw InputError(o.plan_file.empty() ? "--plan" : o.plan_file, "", missing);
  Prediction pred = predict(model, cluster, runtime, plan, seq);
  const int64_t predicted_peak_bytes = static_cast<int64_t>(pred.memory.peak.total());
  if (!pred.memory.fits() && !o.no_fit_check) {
    if (rank == 0)
      std::cerr << "ctxrun: the memory model predicts " << pred.memory.peak.total() / (1 << 30) << " GiB per rank at the "
                << to_string(pred.memory.peak_phase) << " peak against " << pred.memory.device_capacity_bytes / (1 << 30)
                << " GiB usable on " << cluster.gpu.name << " (host " << pred.memory.host_total_bytes_per_node / (1 << 30)
                << " of " << pred.memory.host_capacity_bytes_per_node / (1 << 30)
                << " GiB per node): refusing before allocating anything (--no-fit-check overrides)\n";
    return kExitDoesNotFit;
  }
  o.opt.total_steps = std::max<int64_t>(o.schedule_steps > 0 ? o.schedule_steps : o.steps, 1);
  int nan_step = -1, nan_layer = -1;
  if (!o.debug_nan.empty() && std::sscanf(o.debug_nan.c_str(), "%d:%d", &nan_step, &nan_layer) != 2)
    throw InputError("--debug-nan", "", "expected STEP:LAYER, got '" + o.debug_nan + "'");
  int fail_rank = -1, fail_step = -1;
  if (!o.debug_fail.empty() && std::sscanf(o.debug_fail.c_str(), "%d:%d", &fail_rank, &fail_step) != 2)
    throw InputError("--debug-fail", "", "expected RANK:STEP, got '" + o.debug_fail + "'");

  DataOptions d;
  d.seq = seq;
  d.vocab = model.vocab;
  d.seed = o.data_seed;
  d.doc_mask = plan.mask == MaskKind::document;
  model.rope = rope_for_sequence(model, seq, d.doc_mask);  // HF dynamic NTK: as Hugging Face defines it, or refused
  if (d.doc_mask && plan.docs.kind == DocLengths::Kind::fixed && !plan.docs.tokens.empty())
    d.doc_min = d.doc_max = std::min(plan.docs.tokens[0], seq);
  std::unique_ptr<Dataset> data = o.data.empty() ? make_synthetic(d) : open_token_file(o.data, d);

  std::unique_ptr<Backend> backend;
  if (o.backend == "cuda") {
#ifdef CTXPLAN_HAVE_CUDA
    if (cuda_device_count() == 0) throw InputError("--backend", "", "cuda: no CUDA device is visible to this process");
    // device memory with NCCL communicators (CudaBackend::make_comm); without NCCL the
    // host-staged communicators read tensors through the host, which needs managed memory
    CudaBackendOptions cuda_options;
#ifndef CTXPLAN_HAVE_NCCL
    cuda_options.managed_memory = true;
#endif
    backend = make_cuda_backend(cuda_device_for_local_rank(), cuda_options);
#else
    throw InputError("--backend", "", "cuda: this ctxrun was built without CUDA (configure with -DCTXPLAN_WITH_CUDA=ON)");
#endif
  } else if (o.backend == "cuda-emulated") {
#ifdef CTXPLAN_HAVE_CUDA_EMULATED
    backend = make_cuda_emulated_backend(0);  // device memory, NCCL communicators (emulated)
#else
    throw InputError("--backend", "", "cuda-emulated: this ctxrun was built without the CUDA toolkit's headers, or not "
                                      "on x86-64 Linux (the emulator's fibers need it)");
#endif
  } else {
    CpuMode mode = CpuMode::plain;
    parse_cpu_mode(o.backend, &mode);
    backend = make_cpu_backend(mode);
  }
  backend->set_predicted_peak_bytes(predicted_peak_bytes);
  TrainOptions to;
  to.model = model;
  to.plan = plan;
  to.seq = seq;
  to.opt = o.opt;
  to.seed = o.seed;
  to.sorted_packing = o.sorted_packing || plan.sorted_packing;  // --sorted-packing or the plan's packing=sorted
  Trainer trainer(*backend, world, to, *data);
  if (!o.init_from.empty()) load_hf_weights(trainer, o.init_from);
  int64_t saved_step = -1;  // the step whose checkpoint is on disk from this run (or the one resumed)
  if (o.resume) {
    if (o.ckpt_dir.empty()) throw InputError("--resume", "", "needs --ckpt-dir");
    int64_t s = load_checkpoint(trainer, o.ckpt_dir);
    saved_step = s;
    if (rank == 0) std::printf("resumed from %s at step %lld\n", o.ckpt_dir.c_str(), static_cast<long long>(s));
  }
  if (!o.ckpt_dir.empty()) prepare_checkpoint_dir(trainer, o.ckpt_dir);
  if (rank == 0)
    std::printf("ctxrun: %s, seq %lld, %d ranks, plan %s, data %s, backend %s\n", model.name.c_str(),
                static_cast<long long>(seq), nranks, plan_to_string(plan).c_str(), data->describe().c_str(),
                backend->name().c_str());
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  backend->ledger().reset_peaks();
  RunRecord rec;
  rec.model = model.name;
  rec.cluster = cluster.name;
  rec.gpu = o.backend == "cuda" ? cluster.gpu.name : o.backend == "cuda-emulated" ? "emulated sm_90 (CPU)" : "cpu";
  rec.seq = seq;
  rec.plan = plan;
  json run_info = {{"plan", plan_to_string(plan)}, {"seq", seq}, {"seed", o.seed}, {"data_seed", o.data_seed},
                   {"data", o.data}, {"schedule_steps", o.opt.total_steps}};
  auto save = [&]() {
    // the same step is never saved twice (SIGTERM at a --save-every boundary; --steps equal to the
    // resumed step): its checkpoint is already there
    if (o.ckpt_dir.empty() || trainer.steps_done() == saved_step) return;
    std::string where = save_checkpoint(trainer, o.ckpt_dir, run_info);
    saved_step = trainer.steps_done();
    if (rank == 0) std::printf("saved %s\n", where.c_str());
  };
  int exit_code = kExitOk;
  if (!o.schedule_trace.empty()) trainer.trace_next_step();
  while (trainer.steps_done() < o.steps) {
    if (trainer.steps_done() + 1 == nan_step) trainer.model().inject_nan_at_layer(nan_layer);
    if (rank == fail_rank && trainer.steps_done() + 1 == fail_step)
      throw std::runtime_error("injected failure (--debug-fail) at step " + std::to_string(fail_step));
    StepStats st;
    try {
      st = trainer.step();
    } catch (const DivergedError& e) {
      if (rank == 0) std::cerr << "ctxrun: diverged: " << e.what() << "; no checkpoint written\n";
      return kExitDiverged;
    }
    if (!o.schedule_trace.empty() && rank == 0 && !trainer.schedule().empty()) {
      write_file_atomic(o.schedule_trace, json_dump(schedule_to_json(trainer.schedule()), 1) + "\n");
      o.schedule_trace.clear();
    }
    rec.losses.push_back(st.loss);
    rec.grad_norms.push_back(st.grad_norm);
    rec.step_seconds.push_back(st.seconds);
    for (int i = 0; i < kPhases; ++i) rec.phase_seconds[i] += st.phase_seconds[i];
    rec.measured_steps++;
    rec.tokens_per_step = plan.dp * plan.ga * plan.mbs * seq;  // tokens processed, as the cost model counts them
    if (rank == 0 && (st.step % o.log_every == 0 || st.step == o.steps))
      std::printf("step %5lld  loss %.4f  grad norm %.3f  lr %.2e  %.3f s\n", static_cast<long long>(st.step), st.loss,
                  st.grad_norm, st.lr, st.seconds);
    if (o.save_every > 0 && st.step % o.save_every == 0 && st.step != o.steps) save();
    int stop = g_stop.load();
    trainer.context().world_comm->host_allreduce_max(&stop, 1);
    if (stop) {
      if (rank == 0) std::printf("interrupted after step %lld\n", static_cast<long long>(st.step));
      exit_code = kExitInterrupted;
      break;
    }
  }
  std::fflush(stdout);
  save();
  if (!o.export_hf.empty()) {
    export_hf(trainer, o.export_hf);
    if (rank == 0) std::printf("exported %s\n", o.export_hf.c_str());
  }
  if (!o.report.empty()) {
    json j = measurement_json(trainer, *backend, rec);
    // the memory model of this backend's runtime at the plan's precision; the host side counts the
    // tensors the ledger sees (the process image is not on the ledger)
    RuntimeProfile report_rt = runtime;
    report_rt.host_bytes_per_rank = 0;
    j["prediction"] = prediction_to_json(predict(model, cluster, report_rt, plan, seq));
    j["prediction"]["runtime"] = runtime_name + " at precision=" + to_string(plan.precision) + " (" + backend->name() +
                                 " backend)";
    if (rank == 0) {
      std::ofstream f(o.report + ".tmp");
      f << json_dump(j) << "\n";
      f.close();
      std::filesystem::rename(o.report + ".tmp", o.report);
      std::printf("wrote %s\n", o.report.c_str());
    }
  }
  return exit_code;
}
}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<CommWorld> world;
  try {
    world = make_world(&argc, &argv);
  } catch (const std::exception& e) {
    std::cerr << "ctxrun: cannot start the communicator: " << e.what() << "\n";
    return kExitInternal;
  }
  const int rank = world->world().rank();
  int code = kExitOk;
  try {
    code = run(argc, argv, *world);
  } catch (const InputError& e) {
    if (rank == 0) std::cerr << "ctxrun: error: " << e.what() << "\n";
    code = kExitBadInput;
  } catch (const DeviceOutOfMemory& e) {
    std::cerr << "ctxrun: out of device memory on rank " << rank << ": " << e.what() << "\n";
    code = kExitDoesNotFit;
    if (world->world().size() > 1) world->abort(code);
  } catch (const std::exception& e) {
    std::cerr << "ctxrun: internal error on rank " << rank << ": " << e.what() << "\n";
    code = kExitInternal;
    // the other ranks may be waiting for this one inside a collective: end the whole job
    if (world->world().size() > 1) {
      std::cerr << "ctxrun: aborting all " << world->world().size() << " ranks (checkpoints already on disk are intact)\n";
      world->abort(code);
    }
  }
  std::fflush(stdout);
  return code;
}
