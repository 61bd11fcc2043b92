// Run under mpirun: trains a plan on the world and, on rank 0, the same global batches on one rank
// with no parallelism (the reference). Proves: the step-1 loss and every parameter's gradient equal
// the reference's, and so do the parameters after 3 optimizer steps, within float32 tolerances
// (the only difference is the order of floating-point sums).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "costmodel/errors.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "executor/trainer.hpp"

using namespace ctx;
using namespace ctx::exec;

namespace {
// Tolerances, float32. Gradient: max |g - g_ref| <= kGradTol * max |g_ref| per tensor (sums in a
// different order; ~1e-6 relative per add over a few thousand terms). Loss: relative 1e-5.
// Parameters after 3 AdamW steps: |p - p_ref| <= kParamTol * lr (Adam moves each weight by about lr
// per step; a gradient that is zero up to rounding can move it by up to lr in either direction,
// which this bound allows only as a small fraction).
constexpr double kGradTol = 2e-4, kLossTol = 1e-5, kParamTol = 0.05;

struct Args {
  std::string model = "tiny", plan = "dp=1", mask;
  int64_t seq = 64, steps = 3;
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
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

    auto backend = make_cpu_backend();
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

    // the reference: one rank, no parallelism, the same global batch per step
    std::unique_ptr<Backend> rbe;
    std::unique_ptr<CommWorld> self;
    std::unique_ptr<Trainer> ref;
    if (rank == 0) {
      rbe = make_cpu_backend();
      self = make_self_world();
      TrainOptions ro = o;
      ro.plan = Plan{};
      ro.plan.dp = 1;
      ro.plan.mask = plan.mask;
      ro.plan.docs = plan.docs;
      ro.plan.mbs = 1;  // one sequence at a time: a batched micro-batch must equal its sequences run alone
      ro.plan.ga = plan.ga * plan.dp * plan.mbs;
      ref = std::make_unique<Trainer>(*rbe, *self, ro, *data);
    }
    for (int64_t s = 1; s <= a.steps; ++s) {
      StepStats st = t.step();
      StepStats rs;
      if (rank == 0) rs = ref->step();
      if (s == 1) {
        auto grads = t.params().gather_full("grads");
        if (rank == 0) {
          auto rgrads = ref->params().gather_full("grads");
          double rel = std::fabs(st.loss - rs.loss) / std::fabs(rs.loss);
          std::printf("step 1 loss %.7f reference %.7f (rel %.2e, tol %.0e)\n", st.loss, rs.loss, rel, kLossTol);
          if (!(rel <= kLossTol)) ++failures;
          double worst = 0;
          std::string worst_name;
          for (auto& [name, g] : rgrads) {
            const auto& mine = grads.at(name);
            double diff = 0;
            for (size_t i = 0; i < g.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(mine[i] - g[i])));
            double scale = std::max(max_abs(g), 1e-12);
            if (!(diff <= kGradTol * scale)) {
              std::printf("FAIL gradient %s: max diff %.3e vs max |g| %.3e\n", name.c_str(), diff, scale);
              ++failures;
            }
            if (diff / scale > worst) { worst = diff / scale; worst_name = name; }
          }
          std::printf("gradients: %zu tensors, worst relative diff %.2e (%s), tol %.0e\n", rgrads.size(), worst,
                      worst_name.c_str(), kGradTol);
        }
      }
    }
    auto params = t.params().gather_full("master");
    if (rank == 0) {
      auto rparams = ref->params().gather_full("master");
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
      std::printf("%s: %s on %d ranks, %s\n", failures ? "FAILED" : "PASSED", a.plan.c_str(), nranks, m.name.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    failures = 1000;
  }
  world->world().allreduce_max(&failures, 1);
  return failures ? 1 : 0;
}
