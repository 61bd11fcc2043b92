// The shipped profiles load, agree with the parameter counts their model cards publish, and
// every runtime constant carries a source.
#include <gtest/gtest.h>

#include <cmath>

#include "costmodel/profile_store.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

// Parameter counts as the model cards / papers state them (rounded as published), tolerance 1%.
TEST(Profiles, ParameterCountsMatchModelCards) {
  const std::pair<const char*, double> published[] = {
      {"Llama-3.1-8B", 8.03e9},  {"Llama-3.1-70B", 70.6e9}, {"Llama-3.1-405B", 405.9e9},
      {"Llama-2-7B", 6.74e9},    {"Qwen3-32B", 32.8e9},     {"Qwen3-4B", 4.0e9},
      {"SmolLM3-3B", 3.08e9},    {"GLM-4-9B", 9.4e9},       {"MPT-7B", 6.7e9},
  };
  for (auto& [name, count] : published) {
    double got = static_cast<double>(total_params(resolve_model(profiles(), name)));
    EXPECT_NEAR(got / count, 1.0, 0.01) << name << ": " << got;
  }
}

TEST(Profiles, SmolLM3HasEveryFourthLayerNoPE) {
  ModelSpec m = resolve_model(profiles(), "SmolLM3-3B");
  for (int64_t i = 0; i < m.layers; ++i)
    EXPECT_EQ(m.layer_position[i] == PositionKind::nope, (i + 1) % 4 == 0) << "layer " << i;
}

TEST(Profiles, EveryRuntimeConstantHasASource) {
  ASSERT_GE(profiles().runtimes.size(), 3u);
  for (auto& rt : profiles().runtimes) {
    EXPECT_GE(rt.sources.size(), 20u) << rt.name;
    for (auto& [key, src] : rt.sources) EXPECT_GT(src.size(), 10u) << rt.name << "." << key;
  }
}

TEST(Profiles, ClusterShorthandUsesTheGpuDefaultFabric) {
  ClusterSpec c = resolve_cluster(profiles(), "128x8xh100");
  EXPECT_EQ(world_size(c), 1024);
  EXPECT_EQ(c.gpu.name, "H100-SXM-80GB");
  EXPECT_EQ(c.intra_bytes_per_second, c.gpu.nvlink_bytes_per_second);
  EXPECT_EQ(resolve_cluster(profiles(), "8xh200").nodes, 1);
}

TEST(Profiles, EveryModelRoundTripsThroughJson) {
  for (auto& m : profiles().models) {
    ModelSpec back = model_from_json(model_to_json(m), "round-trip");
    EXPECT_EQ(total_params(back), total_params(m)) << m.name;
    EXPECT_EQ(back.layer_position, m.layer_position) << m.name;
    EXPECT_EQ(back.rope.scaling, m.rope.scaling) << m.name;
  }
}

}  // namespace
}  // namespace ctx
