// Runtime variants (issue 16): a framework version that changes some of a runtime's constants, named
// "<runtime>@<variant>" (a built-in runtime or a runtime JSON path), defined in the runtime profile's
// "variants" with the source of the version fact. hf-deepspeed@liger-int64 is ArcticTraining with
// Liger-Kernel >= 0.6.1 (64-bit indexing: ArcticTraining f274093, Liger-Kernel #804), whose tiled loss has
// no 2^31-element limit; everything else is the base profile's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "costmodel/errors.hpp"
#include "costmodel/json_util.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_variants.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

std::string error_of(const std::string& runtime) {
  try {
    resolve_runtime(profiles(), runtime);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(RuntimeVariants, LigerInt64LiftsOnlyTheIndexLimit) {
  const RuntimeProfile base = resolve_runtime(profiles(), "hf-deepspeed");
  const RuntimeProfile v = resolve_runtime(profiles(), "hf-deepspeed@liger-int64");
  EXPECT_EQ(v.name, "hf-deepspeed@liger-int64");
  EXPECT_DOUBLE_EQ(base.tiled_loss_max_tensor_elements, 2147483647.0);  // Liger < 0.6.1: 32-bit offsets
  EXPECT_DOUBLE_EQ(v.tiled_loss_max_tensor_elements, 0.0);              // no limit
  EXPECT_NE(v.sources.at("tiled_loss_max_tensor_elements").find("0.6.1"), std::string::npos);
  // the rest is the base's: the same memory where the limit does not bind, the same calibration
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "1xh200");
  const Plan p = parse_plan("dp=1,zero=3,recompute=full,opt_offload=1,param_offload=1,tiled_loss=4096,ckpt_offload=1");
  const MemoryPrediction small_base = predict_memory(m, c, base, p, 300000), small_v = predict_memory(m, c, v, p, 300000);
  EXPECT_DOUBLE_EQ(small_base.peak.total(), small_v.peak.total());
  EXPECT_TRUE(small_base.fits_index);
  EXPECT_DOUBLE_EQ(base.gemm_efficiency_scale, v.gemm_efficiency_scale);
  EXPECT_EQ(base.time_residuals.size(), v.time_residuals.size());
  // 650,000 x 4096 = 2,662,400,000 elements per [tokens, hidden] tensor: above 2^31 - 1, so the base's
  // Liger cannot index it (fits_index false) and the variant's can; the bytes are the same
  const MemoryPrediction big_base = predict_memory(m, c, base, p, 650000), big_v = predict_memory(m, c, v, p, 650000);
  EXPECT_FALSE(big_base.fits_index);
  EXPECT_TRUE(big_v.fits_index);
  EXPECT_DOUBLE_EQ(big_base.peak.total(), big_v.peak.total());
}

TEST(RuntimeVariants, BadNamesAreRefusedNamingTheValidOnes) {
  const std::string unknown = error_of("hf-deepspeed@liger-int32");
  EXPECT_NE(unknown.find("hf-deepspeed.json"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("variants"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("hf-deepspeed@liger-int64"), std::string::npos) << unknown;  // the valid ones
  const std::string none = error_of("torchtitan@liger-int64");
  EXPECT_NE(none.find("has no variants"), std::string::npos) << none;
  const std::string no_base = error_of("nosuchstack@x");
  EXPECT_NE(no_base.find("unknown runtime"), std::string::npos) << no_base;
}

TEST(RuntimeVariants, AVariantInAFileNeedsItsSourceAndKnownConstants) {
  json j = read_json_file(std::string(CTXPLAN_SOURCE_DIR) + "/profiles/runtimes/hf-deepspeed.json");
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "ctxplan_runtime_variants";
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, const json& doc) {
    const std::string path = (dir / name).string();
    std::ofstream(path) << doc.dump(2);
    return path;
  };
  // a good file variant resolves through the path
  const std::string good = write("good.json", j);
  EXPECT_DOUBLE_EQ(resolve_runtime(profiles(), good + "@liger-int64").tiled_loss_max_tensor_elements, 0.0);
  // an '@' in a path's folder or file name is part of the path, not a variant
  std::filesystem::create_directories(dir / "team@site");
  const std::string at_dir = (dir / "team@site" / "mine.json").string(), at_name = (dir / "mine@v2.json").string();
  std::ofstream(at_dir) << j.dump(2);
  std::ofstream(at_name) << j.dump(2);
  EXPECT_EQ(resolve_runtime(profiles(), at_dir).name, "hf-deepspeed");
  EXPECT_EQ(resolve_runtime(profiles(), at_name).name, "hf-deepspeed");
  EXPECT_EQ(resolve_runtime(profiles(), at_name + "@liger-int64").name, "hf-deepspeed@liger-int64");
  // no source: refused naming the field
  json unsourced = j;
  unsourced["variants"]["liger-int64"].erase("source");
  const std::string p1 = write("unsourced.json", unsourced);
  const std::string e1 = error_of(p1 + "@liger-int64");
  EXPECT_NE(e1.find("unsourced.json"), std::string::npos) << e1;
  EXPECT_NE(e1.find("source"), std::string::npos) << e1;
  // a constant the runtime does not know: refused with the profile reader's own message
  json unknown = j;
  unknown["variants"]["liger-int64"]["constants"]["tiled_loss_max_tensor_elemnts"] = {{"value", 0}, {"source", "x"}};
  const std::string p2 = write("unknown.json", unknown);
  const std::string e2 = error_of(p2 + "@liger-int64");
  EXPECT_NE(e2.find("unknown runtime constant"), std::string::npos) << e2;
  EXPECT_NE(e2.find("tiled_loss_max_tensor_elements"), std::string::npos) << e2;  // did you mean
  // an empty constants object states no version difference: refused
  json empty = j;
  empty["variants"]["liger-int64"]["constants"] = json::object();
  const std::string e3 = error_of(write("empty.json", empty) + "@liger-int64");
  EXPECT_NE(e3.find("constants"), std::string::npos) << e3;
  std::filesystem::remove_all(dir);
}

TEST(RuntimeVariants, TheListedVariantsAreTheOnesThatResolve) {
  // what `ctxplan show runtime` and the GUI's runtime combo offer
  const std::vector<RuntimeVariantInfo> all = runtime_variants(profiles());
  ASSERT_FALSE(all.empty());
  bool liger = false;
  for (const RuntimeVariantInfo& v : all) {
    EXPECT_FALSE(v.description.empty()) << v.name;
    EXPECT_EQ(resolve_runtime(profiles(), v.name).name, v.name);
    liger |= v.name == "hf-deepspeed@liger-int64";
  }
  EXPECT_TRUE(liger);
  EXPECT_EQ(runtime_variants(profiles(), "hf-deepspeed").size(), 1u);
  EXPECT_TRUE(runtime_variants(profiles(), "torchtitan").empty());
}

}  // namespace
}  // namespace ctx
