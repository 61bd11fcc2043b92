// The data-parallel collectives of a pipeline plan (costmodel/zero_comm.hpp) against a hand count:
// each pipeline rank holds and reduces only its stage's parameters, and the report lists the
// largest stage's (step_model.cpp prices the same per stage: pipeline_time.cpp's step_costs runs on
// the stage's layers, with the embedding's reduction on the first stage and the head's on the last).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "costmodel/memory_model.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/prediction.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/zero_comm.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

const ZeroCommTerm* find(const std::vector<ZeroCommTerm>& terms, const std::string& name) {
  for (const ZeroCommTerm& t : terms)
    if (t.name == name) return &t;
  return nullptr;
}

// Llama-3.1-8B at tp = 2, by hand (tests/test_pipeline_stages.cpp): one layer per TP rank
// 109,060,096 parameters; embedding and head rows 128256 / 2 = 64,128 x 4096 = 262,668,288 each;
// the final norm 4,096. The whole model on one TP rank: 32 x 109,060,096 + 2 x 262,668,288 + 4,096
// = 4,015,263,744.
constexpr double kLayer = 109060096.0, kVocabRows = 262668288.0, kNorm = 4096.0;

TEST(ZeroCommPipeline, EachStageReducesOnlyItsOwnParameters) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const RuntimeProfile rt = resolve_runtime(profiles(), "megatron");
  struct Case {
    const char* plan;
    double params;  // the largest stage's, by hand
    int64_t stage;
  };
  const Case cases[] = {
      // pp = 1: the whole model
      {"tp=2,dp=8,zero=1", 32 * kLayer + 2 * kVocabRows + kNorm, 0},
      // pp = 4 even: 8 layers a stage; the last adds the final norm and the head (the first the
      // embedding, 4,096 fewer): 8 x 109,060,096 + 4,096 + 262,668,288 = 1,135,153,152
      {"tp=2,pp=4,dp=2,zero=1", 8 * kLayer + kNorm + kVocabRows, 3},
      // pp_first = pp_last = 4: the middle stages' 12 layers outweigh the ends' 4 layers and a
      // vocabulary matrix: 12 x 109,060,096 = 1,308,721,152 on stage 1 (the first of the largest)
      {"tp=2,pp=4,pp_first=4,pp_last=4,dp=2,zero=1", 12 * kLayer, 1},
      // pp_embed, pp_loss: (32 + 2) / 4 = 8.5 -> refused; with pp = 2: 17 places a stage, 16 layers
      // each; the first with the embedding, the last with the norm and head: the last is largest
      {"tp=2,pp=2,pp_embed=1,pp_loss=1,dp=4,zero=1", 16 * kLayer + kNorm + kVocabRows, 1},
  };
  for (const Case& k : cases) {
    Plan p = parse_plan(k.plan);
    const ClusterSpec c = resolve_cluster(profiles(), "2x8xh100");
    const PlanCheck chk = check_plan(p, m, c, 8192);
    ASSERT_TRUE(chk.ok()) << k.plan << ": " << chk.message();
    int64_t stage = -1;
    const std::vector<ZeroCommTerm> terms = zero_comm_terms(m, p, local_shapes(m, p, 8192), rt, c.gpus_per_node, &stage);
    EXPECT_EQ(stage, k.stage) << k.plan;
    const ZeroCommTerm* grad = find(terms, "grad_all_reduce");
    if (!grad) grad = find(terms, "grad_reduce_scatter");
    ASSERT_NE(grad, nullptr) << k.plan;
    EXPECT_DOUBLE_EQ(grad->message_bytes, k.params * rt.grad_comm_bytes) << k.plan;
    const ZeroCommTerm* gather = find(terms, "param_all_gather");
    ASSERT_NE(gather, nullptr) << k.plan;
    EXPECT_DOUBLE_EQ(gather->message_bytes, k.params * rt.weight_bytes) << k.plan;
    // predict's report carries the same terms
    const Prediction pr = predict(m, c, rt, p, 8192);
    const ZeroCommTerm* reported = find(pr.zero_comm, grad->name);
    ASSERT_NE(reported, nullptr) << k.plan;
    EXPECT_DOUBLE_EQ(reported->message_bytes, grad->message_bytes) << k.plan;
  }
}

}  // namespace
}  // namespace ctx
