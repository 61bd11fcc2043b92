// `ctxplan maxseq --fixed` and `--plan KEYS` (planner/cmd_plan.cpp, search.cpp), and the ALST on/auto
// spellings of tiled_mlp and tiled_loss (costmodel/plan.cpp, memory_model.cpp).
//   - --fixed answers the longest sequence the exact plan fits: `ctxplan predict` says FITS there and
//     DOES NOT FIT one sequence granule further (exit codes 0 and 3).
//   - maxseq --plan keeps every key given in every plan it reports.
//   - tiled_mlp=on is tiled_mlp=auto (ceil(tokens per rank / hidden)); tiled_loss=on is ArcticTraining's
//     ~1 GiB fp32 logits tiles, hand-derived below.
#include <gtest/gtest.h>

#include <cmath>

#include "costmodel/json_util.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/profile_store.hpp"
#include "run_process.hpp"

namespace ctx {
namespace {

const std::string kProfiles = std::string(CTXPLAN_SOURCE_DIR) + "/profiles";

testing::RunResult ctxplan(std::vector<std::string> args) {
  args.insert(args.begin(), {"--profiles", kProfiles});
  return testing::run_process(CTXPLAN_BIN, args);
}

TEST(MaxSeqFixed, IsTheLongestSequenceThePlanFitsAsPredictSaysIt) {
  const std::string plan = "cp=8,cp_kind=ulysses,zero=3,recompute=full,opt_offload=1,tiled_loss=on,tiled_mlp=on";
  auto r = ctxplan({"maxseq", "--fixed", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--runtime", "hf-deepspeed", "--plan", plan,
                    "--max", "16m", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.both();
  const json j = parse_json_text(r.out, "maxseq --fixed");
  const int64_t s = j.at("max_seq"), g = j.at("granule");
  ASSERT_GT(s, 0);
  ASSERT_LT(s + g, int64_t(16) << 20);  // below --max: the bisection found the edge
  auto at = [&](int64_t seq) {
    return ctxplan({"predict", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--runtime", "hf-deepspeed", "--plan", plan, "--seq",
                    std::to_string(seq)})
        .exit_code;
  };
  EXPECT_EQ(at(s), 0) << s;      // FITS
  EXPECT_EQ(at(s + g), 3) << s;  // DOES NOT FIT
}

TEST(MaxSeqFixed, AnInvalidPlanIsABadInput) {
  auto r = ctxplan({"maxseq", "--fixed", "--cluster", "8xh100", "--plan", "tp=3"});
  EXPECT_EQ(r.exit_code, 2) << r.both();
  EXPECT_NE(r.err.find("--plan"), std::string::npos) << r.err;
}

TEST(MaxSeqSearch, EveryPlanKeepsTheKeysGiven) {
  auto r = ctxplan({"maxseq", "--model", "Llama-3.1-8B", "--cluster", "2x8xh100", "--runtime", "hf-deepspeed", "--gpus", "8,16",
                    "--plan", "cp_kind=ulysses,tiled_mlp=on,zero=3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.both();
  const json j = parse_json_text(r.out, "maxseq");
  int rows = 0;
  for (auto& row : j.at("rows")) {
    if (!row.contains("plan")) continue;
    const Plan p = parse_plan(row.at("plan").get<std::string>());
    const json pj = plan_to_json(p);
    EXPECT_EQ(pj.value("cp_kind", ""), "ulysses") << row.dump();
    EXPECT_EQ(pj.at("tiled_mlp"), "auto") << row.dump();
    EXPECT_EQ(p.zero, 3) << row.dump();
    ++rows;
  }
  EXPECT_EQ(rows, 2);
}

TEST(TiledSpellings, OnMeansTheDocumentedAlstDefaults) {
  EXPECT_EQ(parse_plan("tiled_mlp=on").tiled_mlp, parse_plan("tiled_mlp=auto").tiled_mlp);
  EXPECT_EQ(parse_plan("tiled_loss=on").tiled_loss, parse_plan("tiled_loss=auto").tiled_loss);
  EXPECT_EQ(parse_plan("tiled_mlp=off").tiled_mlp, 0);
  EXPECT_EQ(parse_plan("tiled_loss=off").tiled_loss, 0);
  // round trip: text and JSON keep "auto"
  EXPECT_EQ(parse_plan(plan_to_string(parse_plan("tiled_loss=on"))).tiled_loss, -1);
  EXPECT_EQ(plan_from_json(plan_to_json(parse_plan("tiled_loss=on,tiled_mlp=on")), "t").tiled_loss, -1);

  const Profiles prof = load_profiles(kProfiles);
  const ModelSpec m = resolve_model(prof, "Llama-3.1-8B");  // hidden 4096, vocab 128256
  Plan p = parse_plan("cp=8,cp_kind=ulysses,tiled_mlp=on,tiled_loss=on");
  const LocalShapes s = local_shapes(m, p, 1 << 20);  // 131072 tokens per rank
  ASSERT_EQ(s.tokens, 131072.0);
  // TiledMLP: ceil(131072 / 4096) = 32 shards
  EXPECT_EQ(mlp_chunks(m, p, s), 32.0);
  // tiled loss: 131072 x 128256 x 4 B = 62.625 GiB of fp32 logits -> ceil = 63 shards of
  // ceil(131072 / 63) = 2081 rows (ArcticTraining: num_shards = ceil(size_in_gb / 1))
  EXPECT_EQ(loss_tile_tokens(p, s), 2081.0);
  // and the memory model prices it as 2081-token tiles
  const Plan q = parse_plan("cp=8,cp_kind=ulysses,tiled_mlp=on,tiled_loss=2081");
  const ClusterSpec c = resolve_cluster(prof, "8xh100");
  const RuntimeProfile rt = resolve_runtime(prof, "hf-deepspeed");
  EXPECT_EQ(predict_memory(m, c, rt, p, 1 << 20).peak.total(), predict_memory(m, c, rt, q, 1 << 20).peak.total());
}

}  // namespace
}  // namespace ctx
