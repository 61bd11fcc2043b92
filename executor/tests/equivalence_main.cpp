// Run under mpirun: trains a plan on the world (on the backend --backend names) and, on rank 0, the
// same global batches on one rank with no parallelism on the plain CPU backend (the reference).
// precision=fp32 proves: the step-1 loss and every parameter's gradient equal the reference's, and
// so do the parameters after 3 optimizer steps, within float32 tolerances (the only difference is
// the order of floating-point sums). precision=bf16 proves the step-1 loss and gradients, and the
// last step's loss, against the single-rank bf16 run AND the single-rank fp32 run, at
// TransformerEngine's context-parallel tolerances (bf16: atol = rtol = 2.5e-2).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "costmodel/errors.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "executor/trainer.hpp"
#ifdef CTXPLAN_HAVE_CUDA_EMULATED
#include "executor/cuda/emulated/cuda_emulated.hpp"
#endif

using namespace ctx;
using namespace ctx::exec;

namespace {
// Tolerances, float32. Gradient: max |g - g_ref| <= kGradTol * max |g_ref| per tensor (sums in a
// different order; ~1e-6 relative per add over a few thousand terms). Loss: relative 1e-5.
// Parameters after 3 AdamW steps: |p - p_ref| <= kParamTol * lr (Adam moves each weight by about lr
// per step; a gradient that is zero up to rounding can move it by up to lr in either direction,
// which this bound allows only as a small fraction).
constexpr double kGradTol = 2e-4, kLossTol = 1e-5, kParamTol = 0.05;
// bf16 (TransformerEngine's test_fused_attn_with_cp: atol = rtol = 2.5e-2 for bf16). TE's tensors are
// O(1) (randn inputs); ours are gradients of a small model, so atol is applied in units of each
// tensor's largest reference magnitude: |g - g_ref| <= atol * max|g_ref| + rtol * |g_ref| elementwise.
constexpr double kBf16Atol = 2.5e-2, kBf16Rtol = 2.5e-2;

struct Args {
  std::string model = "tiny", plan = "dp=1", mask, backend = "cpu";
  int64_t seq = 64, steps = 3;
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

using Tensors = std::map<std::string, std::vector<float>>;

// One single-rank reference run (rank 0 only): the plan's batches, no parallelism.
struct Reference {
  std::unique_ptr<Backend> be;
  std::unique_ptr<CommWorld> self;
  std::unique_ptr<Trainer> t;
};
Reference make_reference(const TrainOptions& o, const Plan& plan, Precision precision, const Dataset& data) {
  Reference r;
  r.be = make_cpu_backend();
  r.self = make_self_world();
  TrainOptions ro = o;
  ro.plan = Plan{};
  ro.plan.dp = 1;
  ro.plan.mask = plan.mask;
  ro.plan.docs = plan.docs;
  ro.plan.precision = precision;
  ro.plan.master = plan.master;  // optimizer precision: the same dtypes, unsharded
  ro.plan.moments = plan.moments;
  ro.plan.mbs = 1;  // one sequence at a time: a batched micro-batch must equal its sequences run alone
  ro.plan.ga = plan.ga * plan.dp * plan.mbs;
  r.t = std::make_unique<Trainer>(*r.be, *r.self, ro, data);
  return r;
}

// Gradients against a reference: float32 (max diff <= kGradTol * max|ref|) or bf16 (TE tolerances).
int compare_grads(const Tensors& mine, const Tensors& ref, bool bf16, const char* what) {
  int failures = 0;
  double worst = 0;
  std::string worst_name;
  for (auto& [name, g] : ref) {
    const auto& m = mine.at(name);
    const double scale = std::max(max_abs(g), 1e-12);
    double excess = 0;  // largest |diff| / allowed
    for (size_t i = 0; i < g.size(); ++i) {
      const double diff = std::fabs(static_cast<double>(m[i]) - g[i]);
      const double allowed = bf16 ? kBf16Atol * scale + kBf16Rtol * std::fabs(g[i]) : kGradTol * scale;
      excess = std::max(excess, diff / allowed);
    }
    if (!(excess <= 1.0)) {
      std::printf("FAIL gradient %s vs %s: %.2f x the tolerance\n", name.c_str(), what, excess);
      ++failures;
    }
    if (excess > worst) { worst = excess; worst_name = name; }
  }
  std::printf("gradients vs %s: %zu tensors, worst %.3f x the tolerance (%s)\n", what, ref.size(), worst,
              worst_name.c_str());
  return failures;
}

int compare_loss(double loss, double ref, double tol, const char* what) {
  const double rel = std::fabs(loss - ref) / std::fabs(ref);
  std::printf("loss %.7f vs %s %.7f (rel %.2e, tol %.1e)\n", loss, what, ref, rel, tol);
  return rel <= tol ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  auto world = make_world(&argc, &argv);
  const int rank = world->world().rank(), nranks = world->world().size();
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") a.model = v;
    else if (k == "--plan") a.plan = v;
    else if (k == "--seq") a.seq = std::stoll(v);
    else if (k == "--steps") a.steps = std::stoll(v);
    else if (k == "--backend") a.backend = v;
  }
  int failures = 0;
  try {
    Profiles prof = load_profiles(default_profiles_dir());
    ModelSpec m = resolve_model(prof, a.model);
    Plan plan = parse_plan(a.plan);
    ClusterSpec c = make_cluster(resolve_hardware(prof, "h100"), 1, nranks);
    PlanCheck chk = check_plan(plan, m, c, a.seq);
    if (!chk.ok()) throw InputError("--plan", "", chk.message());
    std::string why = executor_plan_problem(m, plan, a.seq);
    if (!why.empty()) throw InputError("--plan", "", why);

    std::unique_ptr<Backend> backend;
    CpuMode mode;
    if (a.backend == "cuda-emulated") {
#ifdef CTXPLAN_HAVE_CUDA_EMULATED
      backend = make_cuda_emulated_backend(0);  // the CUDA backend on CPU doubles of CUDA, cuBLASLt, NCCL
#else
      throw InputError("--backend", "", "cuda-emulated: not built (needs the CUDA toolkit's headers, x86-64 Linux)");
#endif
    } else if (parse_cpu_mode(a.backend, &mode)) {
      backend = make_cpu_backend(mode);
    } else {
      throw InputError("--backend", "", "expected cpu, cpu-guarded, cpu-deferred or cuda-emulated");
    }
    const bool bf16 = plan.precision == Precision::bf16;
    TrainOptions o;
    o.model = m;
    o.plan = plan;
    o.seq = a.seq;
    o.opt.lr = 1e-3f;
    o.opt.warmup = 0;
    o.opt.total_steps = 100;
    o.sorted_packing = plan.sorted_packing;  // the reference packs in order: the global batch is the same
    DataOptions d;
    d.seq = a.seq;
    d.vocab = m.vocab;
    d.doc_mask = plan.mask == MaskKind::document;
    if (d.doc_mask && plan.docs.kind == DocLengths::Kind::fixed && !plan.docs.tokens.empty())
      d.doc_min = d.doc_max = plan.docs.tokens[0];
    auto data = make_synthetic(d);
    Trainer t(*backend, *world, o, *data);

    // the references (rank 0): the plan's precision, and fp32 as well for a bf16 plan
    Reference ref, ref32;
    if (rank == 0) {
      ref = make_reference(o, plan, plan.precision, *data);
      if (bf16) ref32 = make_reference(o, plan, Precision::fp32, *data);
    }
    StepStats st, rs, rs32;
    for (int64_t s = 1; s <= a.steps; ++s) {
      st = t.step();
      if (rank == 0) {
        rs = ref.t->step();
        if (bf16) rs32 = ref32.t->step();
      }
      if (s != 1) continue;
      auto grads = t.params().gather_full("grads");
      if (rank != 0) continue;
      std::printf("step 1 on %s (%s):\n", backend->name().c_str(), bf16 ? "bf16" : "fp32");
      failures += compare_loss(st.loss, rs.loss, bf16 ? kBf16Rtol : kLossTol, "reference");
      failures += compare_grads(grads, ref.t->params().gather_full("grads"), bf16, "reference");
      if (bf16) {
        failures += compare_loss(st.loss, rs32.loss, kBf16Rtol, "fp32 reference");
        failures += compare_grads(grads, ref32.t->params().gather_full("grads"), true, "fp32 reference");
      }
    }
    auto params = t.params().gather_full("master");
    if (rank == 0) {
      if (bf16) {
        std::printf("step %lld:\n", static_cast<long long>(a.steps));
        failures += compare_loss(st.loss, rs.loss, kBf16Rtol, "reference");
        failures += compare_loss(st.loss, rs32.loss, kBf16Rtol, "fp32 reference");
      } else {
        auto rparams = ref.t->params().gather_full("master");
        double worst = 0;
        std::string worst_name;
        for (auto& [name, p] : rparams) {
          const auto& mine = params.at(name);
          double diff = 0;
          for (size_t i = 0; i < p.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(mine[i] - p[i])));
          if (diff > worst) { worst = diff; worst_name = name; }
        }
        std::printf("parameters after %lld steps: worst max diff %.2e (%s), tol %.1e (%.2f x lr)\n",
                    static_cast<long long>(a.steps), worst, worst_name.c_str(), kParamTol * o.opt.lr, kParamTol);
        if (!(worst <= kParamTol * o.opt.lr)) ++failures;
      }
      std::printf("%s: %s on %d ranks, %s, backend %s\n", failures ? "FAILED" : "PASSED", a.plan.c_str(), nranks,
                  m.name.c_str(), backend->name().c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    failures = 1000;
  }
  world->world().allreduce_max(&failures, 1, HostType::i32);
  return failures ? 1 : 0;
}
