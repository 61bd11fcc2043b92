// Maximum trainable sequence of Llama-3.1-8B under ALST's plans (profiles/validation/
// alst_maxseq.jsonl, copied from the published tables with sources), predicted with the
// hf-deepspeed runtime profile, against the published maximum. Prints the table that
// docs/VALIDATION.md carries.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "costmodel/attention_kernels.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "planner/validation_points.hpp"
#include "validation_data.hpp"

namespace ctx {
namespace {

// Our honest bound on |predicted/published - 1| for a maximum sequence length. Published maxima
// are the longest lengths the authors tried that ran (their real limit lies somewhat above),
// and allocator behaviour at the edge of memory is not modelled token by token.
constexpr double kMaxSeqTolerance = 0.30;

TEST(ValidationAlst, MaxTrainableSequenceMatchesPublished) {
  Profiles profiles = load_profiles(default_profiles_dir());
  auto points = test::read_jsonl("alst_maxseq.jsonl");
  ASSERT_GE(points.size(), 8u);
  std::printf("\n| point | GPUs | plan | published max | predicted max | error |\n|---|---|---|---|---|---|\n");
  double log_sum = 0;
  int fit = 0;
  for (auto& pt : points) {
    // check points (role "check": a stand-in runtime, only compared) are printed and not asserted;
    // `ctxplan validate` reports them apart from the fit points
    const bool check = pt.contains("role") && pt["role"] == "check";
    ModelSpec m = resolve_model(profiles, pt["model"]);
    ClusterSpec c = resolve_cluster(profiles, pt["cluster"]);
    RuntimeProfile rt = resolve_runtime(profiles, pt["runtime"]);
    // the kernel the point's source states (attention, quoted in attention_source), as ctxplan validate prices it
    if (pt.contains("attention")) {
      ASSERT_TRUE(pt.contains("attention_source")) << pt["id"];
      rt = with_attention(rt, pt["attention"].get<std::string>(), "alst_maxseq.jsonl", "attention");
    }
    Plan p = parse_plan(pt["plan"].get<std::string>());
    int64_t published = pt["published_max_seq_tokens"];
    PlanCheck chk = check_plan(p, m, c, seq_granule(p) * 1000);
    ASSERT_TRUE(chk.ok()) << pt["id"] << ": " << chk.message();
    int64_t predicted = max_trainable_seq(m, c, rt, p, int64_t(1) << 27);
    // against [published, failed) where the source states a length that failed (ctxplan validate's bracket)
    const double failed = pt.contains("published_failed_seq_tokens") ? pt["published_failed_seq_tokens"].get<double>() : 0.0;
    const double ratio = max_seq_error_ratio(static_cast<double>(predicted), static_cast<double>(published), failed);
    double err = ratio - 1.0;
    std::printf("| %s%s | %lld | `%s` | %lld | %lld | %+.1f%% |\n", pt["id"].get<std::string>().c_str(), check ? " (check)" : "",
                static_cast<long long>(world_size(c)), pt["plan"].get<std::string>().c_str(),
                static_cast<long long>(published), static_cast<long long>(predicted), 100 * err);
    if (check) continue;
    log_sum += std::fabs(std::log(ratio));
    ++fit;
    EXPECT_LE(std::fabs(err), kMaxSeqTolerance) << pt["id"];
  }
  ASSERT_GE(fit, 8);
  std::printf("\ngeometric-mean |error| over the fit points: %.1f%%\n", 100 * (std::exp(log_sum / fit) - 1));
}

}  // namespace
}  // namespace ctx
