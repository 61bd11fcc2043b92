// backend_ops: the op cases (executor/tests/op_cases.hpp) on one backend, in the manner of ggml's
// test-backend-ops and nccl-tests.
//
//   backend_ops --backend cpu|cuda|cuda-emulated --mode test|perf [--filter REGEX] [--iters N]
//               [--check] [--no-check] [--full] [--all]
//
// test: every test case (small shapes) once, compared with its float64 reference (cuda-emulated:
//       the cases marked emulated, every one today; --all ignores the mark). Exit 1 when a case fails.
// perf: the perf shapes (GPU: attention head_dim 128, GQA 4:1 and 8:1, 8K-32K tokens, causal and
//       document masks; GEMM 8192^3 and Llama-3-8B projections at 4K tokens; the other ops at
//       Llama-8B sizes). On cpu the reduced shapes unless --full; cuda-emulated times the test
//       shapes (emulator timings say nothing about a GPU). Each case: one run, the error check
//       outside the timed loop (only where the float64 reference is cheap, < 2e9 multiply-adds,
//       unless --check; --no-check skips it), one warm-up run, then N timed runs between two
//       mark_time events (CUDA events on a GPU), N chosen to fill ~0.5 s unless --iters.
// Printed per case: name, shape, dtype, result with max |err| and err/tol (<= 1 passes), time per
// run, TFLOP/s and GB/s (bytes read + written by one run, each tensor once).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "executor/backend.hpp"
#include "executor/tests/op_cases.hpp"
#ifdef CTXPLAN_HAVE_CUDA
#include "executor/cuda/cuda_backend.hpp"
#endif
#ifdef CTXPLAN_HAVE_CUDA_EMULATED
#include "executor/cuda/emulated/cuda_emulated.hpp"
#endif

using namespace ctx::exec;

namespace {

int usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: backend_ops --backend cpu|cuda|cuda-emulated --mode test|perf [--filter REGEX] [--iters N]"
               " [--check] [--no-check] [--full] [--all]\n",
               msg);
  return 2;
}

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
#ifdef CTXPLAN_HAVE_CUDA
  if (name == "cuda") {
    if (cuda_device_count() == 0) throw std::runtime_error("no CUDA device");
    return make_cuda_backend(0);
  }
#endif
#ifdef CTXPLAN_HAVE_CUDA_EMULATED
  if (name == "cuda-emulated") return make_cuda_emulated_backend(0);
#endif
  throw std::runtime_error("backend '" + name + "' is not built into this backend_ops");
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::string human(double x, const char* unit) {
  char b[32];
  if (x <= 0) return "-";
  std::snprintf(b, sizeof b, "%.3g %s", x, unit);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend_name = "cpu", mode = "test", filter;
  int iters = 0;
  bool force_check = false, no_check = false, full = false, all = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--backend") backend_name = next();
    else if (a == "--mode") mode = next();
    else if (a == "--filter") filter = next();
    else if (a == "--iters") iters = std::atoi(next().c_str());
    else if (a == "--check") force_check = true;
    else if (a == "--no-check") no_check = true;
    else if (a == "--full") full = true;
    else if (a == "--all") all = true;
    else if (a == "-h" || a == "--help") return usage("backend_ops: the op cases on one backend"), 0;
    else return usage(("unknown argument " + a).c_str());
  }
  if (mode != "test" && mode != "perf") return usage("--mode must be test or perf");
  std::unique_ptr<Backend> be;
  try {
    be = make_backend(backend_name);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "backend_ops: %s\n", e.what());
    return 3;
  }
  const bool emulated = backend_name == "cuda-emulated", perf = mode == "perf";
  std::vector<opcases::OpCase> cases;
  if (perf && !emulated) cases = opcases::perf_cases(backend_name != "cuda" && !full);
  else
    for (auto& c : opcases::test_cases())
      if (!emulated || all || c.emulated) cases.push_back(c);
  const std::regex re(filter.empty() ? ".*" : filter);

  std::printf("backend_ops: backend %s, mode %s%s\n", be->name().c_str(), mode.c_str(),
              perf && backend_name == "cpu" && !full ? " (reduced shapes)" : "");
  std::printf("%-44s %-44s %-12s %-6s %-10s %-8s %-10s %-10s %-10s\n", "case", "shape", "dtype", "result", "max|err|",
              "err/tol", "time", "TFLOP/s", "GB/s");
  int failed = 0, ran = 0;
  for (const auto& c : cases) {
    if (!std::regex_search(c.name, re)) continue;
    ++ran;
    std::string result = "-", err = "-", ratio = "-", detail;
    double t_run = 0;
    try {
      auto inst = c.make(*be);
      be->synchronize();
      double t0 = now();
      inst->run();
      be->synchronize();
      t_run = now() - t0;
      const bool check = !no_check && (!perf || force_check || c.ref_cost < 2e9);
      if (check) {
        double worst = 0, max_err = 0;
        for (const auto& chk : inst->check()) {
          max_err = std::max(max_err, chk.max_abs_err);
          if (chk.worst >= worst) worst = chk.worst;
          if (!chk.ok()) detail += "    " + chk.describe() + "\n";
        }
        result = detail.empty() ? "ok" : "FAIL";
        failed += detail.empty() ? 0 : 1;
        char b[32];
        std::snprintf(b, sizeof b, "%.2e", max_err);
        err = b;
        std::snprintf(b, sizeof b, "%.3f", worst);
        ratio = b;
      }
      if (perf) {  // warm-up, then the timed loop between two stream-ordered marks
        inst->run();
        int n = iters > 0 ? iters : std::clamp(static_cast<int>(0.5 / std::max(t_run, 1e-6)), 1, 200);
        be->mark_time(0);
        for (int k = 0; k < n; ++k) inst->run();
        be->mark_time(1);
        be->synchronize();
        auto t = be->read_times();
        t_run = (t.size() > 1 && t[0] >= 0 && t[1] >= 0) ? (t[1] - t[0]) / n : t_run;
      }
    } catch (const std::exception& e) {
      result = "ERROR";
      detail = std::string("    ") + e.what() + "\n";
      ++failed;
    }
    std::printf("%-44s %-44s %-12s %-6s %-10s %-8s %-10s %-10s %-10s\n", c.name.c_str(), c.shape.substr(0, 44).c_str(),
                c.dtype.c_str(), result.c_str(), err.c_str(), ratio.c_str(), human(t_run * 1e3, "ms").c_str(),
                c.flops > 0 && t_run > 0 ? human(c.flops / t_run / 1e12, "").c_str() : "-",
                t_run > 0 ? human(c.bytes / t_run / 1e9, "").c_str() : "-");
    if (!detail.empty()) std::printf("%s    tolerance: %s\n", detail.c_str(), c.tolerance.c_str());
    std::fflush(stdout);
  }
  std::printf("backend_ops: %d cases, %d failed\n", ran, failed);
  return failed ? 1 : 0;
}
