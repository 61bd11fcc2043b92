// Step time against published measurements (profiles/validation/published_time.jsonl), through
// `ctxplan validate --json`, each metric computed the way its source defines it (ALST's Megatron
// TFLOPS with non-causal attention and recompute, NeMo model TFLOPS, llm-foundry MFU, tokens/s).
// Tolerances (stated, and docs/VALIDATION.md explains the misses):
//   - attention-dominated ALST runs (>= 500K tokens, Ulysses) priced with FA2, the kernel their
//     recipes name (`validate --json` reports the kernel each row was priced with): step time within
//     15%. alst-t1-r4 is not one: its recipe runs `attn_implementation: sdpa` (the point says so).
//   - every point: the prediction is within a factor of 2.5 (no wild misses)
// NeMo Llama-2-7B weak scaling 4K..1M with CP (TFLOPS) has no tighter claim. Its source states the
// NeMo 24.03.01 container, whose Transformer Engine (1.3) runs cuDNN fused attention on H100, with or
// without CP; the points say cudnn. Our cudnn curve is the FlashAttention-3 paper's (a July-2024 cuDNN
// 9.x) and prices them 7-50% faster than published; no curve for the container's own cuDNN is
// published, so the rows stay a documented miss (docs/VALIDATION.md), checked only for the kernel
// they are priced with and by the 2.5x guard.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <map>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <utility>

#include "costmodel/json_util.hpp"

namespace {

ctx::json run_validate() {
  std::string cmd = std::string(CTXPLAN_BIN) + " validate --json";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe.get())) > 0) out.append(buf, n);
  return ctx::parse_json_text(out, "ctxplan validate --json");
}

const ctx::json& rows() {
  static ctx::json j = run_validate();
  return j.at("rows");
}

TEST(ValidationTime, AttentionDominatedFa2AlstStepTimeWithin15Percent) {
  int checked = 0, sdpa = 0;
  for (auto& r : rows()) {
    std::string id = r.at("id");
    if (id.rfind("alst-", 0) != 0 || r.at("metric") != "iteration_time_s") continue;
    if (r.at("published").get<double>() < 500) continue;  // the >= 500K-token runs take 500+ s
    if (r.at("attention") != "fa2") {
      EXPECT_EQ(id, "alst-t1-r4:iteration_time_s") << "only r4's recipe names another kernel";
      EXPECT_EQ(r.at("attention"), "sdpa") << id;
      ++sdpa;
      continue;
    }
    EXPECT_NEAR(r.at("predicted").get<double>() / r.at("published").get<double>(), 1.0, 0.15) << id;
    ++checked;
  }
  EXPECT_EQ(checked, 5);  // t1-r3, t1-r5, t1-r6, t2-alst, t4-alst (recipes: flash_attention_2)
  EXPECT_EQ(sdpa, 1);
}

TEST(ValidationTime, NemoPointsArePricedWithTheContainersCudnnAttention) {
  int checked = 0;
  for (auto& r : rows()) {
    std::string id = r.at("id");
    if (id.rfind("nemo-", 0) != 0) continue;
    EXPECT_EQ(r.at("attention"), "cudnn") << id;
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

TEST(ValidationTime, NoFitPointOffByMoreThan2_5x) {
  // check points (role "check", e.g. the Ring Attention maxima priced on a stand-in runtime) are
  // reported, not guarded: they are out-of-sample comparisons
  for (auto& r : rows()) {
    if (r.at("role") != "fit") continue;
    double ratio = r.at("predicted").get<double>() / r.at("published").get<double>();
    EXPECT_GT(ratio, 1 / 2.5) << r.at("id");
    EXPECT_LT(ratio, 2.5) << r.at("id");
  }
}

TEST(ValidationTime, HeldOutPublishedPointsArePricedAndWithin2_5x) {
  // the held-out published runs of published_time.jsonl (role "check": NeMo, Megatron-Bridge and torchtitan
  // rows nobody fitted to, among them the first with pipeline stages; docs/VALIDATION.md "Check points
  // (held out)") are priced and held to the same no-wild-miss guard as the fit points, a factor 2.5. Not
  // the Ring Attention maxima (alst_maxseq.jsonl, max_seq_tokens), priced on a stand-in runtime.
  int checked = 0, pipelined = 0;
  for (auto& r : rows()) {
    if (r.at("role") != "check" || r.at("metric") == "max_seq_tokens") continue;
    const double ratio = r.at("predicted").get<double>() / r.at("published").get<double>();
    EXPECT_GT(ratio, 1 / 2.5) << r.at("id");
    EXPECT_LT(ratio, 2.5) << r.at("id");
    if (r.at("plan").get<std::string>().find("pp=") != std::string::npos) ++pipelined;
    ++checked;
  }
  EXPECT_GE(checked, 37);   // 5 torchtitan memory rows + 28 rows added for issue 16 + 4 Hugging Face Ulysses blog rows
  EXPECT_GE(pipelined, 8);  // NeMo 8K (pp=2), NeMo 24.07 13B/70B/Llama-3 70B, Megatron-Bridge 70B x2, 405B x2 (uneven split)
}

TEST(ValidationTime, FitAndCheckPointsAreSummarisedApart) {
  // the summary gives each metric over all its points and, where both roles exist, fit and check apart:
  // the counts add up and every row's role is fit or check
  static ctx::json j = run_validate();
  std::map<std::string, std::map<std::string, int>> counted;
  for (auto& r : j.at("rows")) {
    const std::string role = r.at("role").get<std::string>();
    EXPECT_TRUE(role == "fit" || role == "check") << r.at("id");
    counted[r.at("metric").get<std::string>()][role] += 1;
  }
  EXPECT_GT(counted["max_seq_tokens"]["check"], 0) << "the Ring Attention maxima are check points";
  for (auto& [metric, roles] : counted) {
    const ctx::json& s = j.at("summary").at(metric);
    EXPECT_EQ(s.at("points").get<int>(), roles["fit"] + roles["check"]) << metric;
    for (auto& [role, n] : roles)
      if (n > 0) {
        EXPECT_EQ(s.at(role).at("points").get<int>(), n) << metric << " " << role;
      }
  }
}

TEST(ValidationTime, MaxSeqPointsArePricedWithTheKernelTheirSourceStates) {
  // a max_seq_tokens point may state its attention implementation (with attention_source), as a
  // published_time.jsonl point does: ArcticTraining's 1x H200 recipes run flash_attention_3
  // (alst_maxseq.jsonl at-8b-h200-*), alst-t1-r4's sdpa (run-sp8-llama-8b-yes-mlp.yml); points that
  // state none are priced with the runtime's default (hf-deepspeed: fa2)
  int fa3 = 0, sdpa = 0, defaults = 0;
  for (auto& r : rows()) {
    if (r.at("metric") != "max_seq_tokens") continue;
    const std::string id = r.at("id");
    if (id.rfind("at-8b-h200-", 0) == 0) {
      EXPECT_EQ(r.at("attention"), "fa3") << id;
      ++fa3;
    } else if (id == "alst-t1-r4:max_seq_tokens") {
      EXPECT_EQ(r.at("attention"), "sdpa") << id;  // its recipe: attn_implementation sdpa
      ++sdpa;
    } else if (id.rfind("alst-", 0) == 0) {
      EXPECT_EQ(r.at("attention"), "fa2") << id;
      ++defaults;
    }
  }
  EXPECT_EQ(fa3, 4);
  EXPECT_EQ(sdpa, 1);
  EXPECT_EQ(defaults, 9);
}

// `ctxplan --profiles DIR validate` over a copy of the profiles whose alst_maxseq.jsonl is `line`:
// the exit status and what it printed
std::pair<int, std::string> validate_with_maxseq_line(const std::string& name, const std::string& line) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("ctxplan_maxseq_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(std::string(CTXPLAN_SOURCE_DIR) + "/profiles", dir, fs::copy_options::recursive);
  std::ofstream(dir / "validation" / "alst_maxseq.jsonl") << line << "\n";
  const std::string cmd = std::string(CTXPLAN_BIN) + " --profiles " + dir.string() + " validate --only alst-t2-base 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  fs::remove_all(dir);
  return {WEXITSTATUS(status), out};
}

TEST(ValidationTime, MaxSeqPointAttentionNeedsItsSourceAndAKernelTheRuntimeRuns) {
  const std::string head = R"({"id": "alst-t2-base", "model": "Llama-3.1-8B", "cluster": "1xh100", "runtime": "hf-deepspeed", )"
                           R"("plan": "dp=1,zero=3,recompute=full,opt_offload=1,param_offload=1", "published_max_seq_tokens": 32000)";
  auto [ok, ok_out] = validate_with_maxseq_line("ok", head + R"(, "attention": "fa3", "attention_source": "a recipe line"})");
  EXPECT_EQ(ok, 0) << ok_out;
  auto [unsourced, unsourced_out] = validate_with_maxseq_line("unsourced", head + R"(, "attention": "fa3"})");
  EXPECT_EQ(unsourced, 2) << unsourced_out;
  EXPECT_NE(unsourced_out.find("attention_source"), std::string::npos) << unsourced_out;
  EXPECT_NE(unsourced_out.find("alst_maxseq.jsonl"), std::string::npos) << unsourced_out;
  auto [unknown, unknown_out] = validate_with_maxseq_line("unknown", head + R"(, "attention": "fa9", "attention_source": "x"})");
  EXPECT_EQ(unknown, 2) << unknown_out;
  EXPECT_NE(unknown_out.find("fa9"), std::string::npos) << unknown_out;
  EXPECT_NE(unknown_out.find("fa2"), std::string::npos) << unknown_out;  // the valid values are listed
}

// A runtime variant (a framework version) is a fact the point's source states, quoted like its kernel
// (the id is one validate --only selects in the helper)
TEST(ValidationTime, MaxSeqPointRuntimeVariantNeedsItsSource) {
  const std::string head = R"({"id": "alst-t2-base", "model": "Llama-3.1-8B", "cluster": "1xh100", "runtime": "hf-deepspeed@liger-int64", )"
                           R"("plan": "dp=1,zero=3,recompute=full,opt_offload=1,param_offload=1,tiled_loss=4096", "published_max_seq_tokens": 32000)";
  auto [ok, ok_out] = validate_with_maxseq_line("ok", head + R"(, "runtime_source": "a commit requiring Liger 0.6.1"})");
  EXPECT_EQ(ok, 0) << ok_out;
  auto [unsourced, unsourced_out] = validate_with_maxseq_line("unsourced", head + "}");
  EXPECT_EQ(unsourced, 2) << unsourced_out;
  EXPECT_NE(unsourced_out.find("runtime_source"), std::string::npos) << unsourced_out;
  EXPECT_NE(unsourced_out.find("alst_maxseq.jsonl"), std::string::npos) << unsourced_out;
}

// A maximum-sequence point whose source states both the length that ran and a length that failed is
// a bracket: the limit lies in [ran, failed). The failing length is a fact quoted like the kernel, and
// must lie above the length that ran. alst-t2-base's plan is predicted 37,358 (docs/VALIDATION.md).
TEST(ValidationTime, MaxSeqBracketNeedsItsSourceAndComparesWithTheNearerEnd) {
  const std::string head = R"({"id": "alst-t2-base", "model": "Llama-3.1-8B", "cluster": "1xh100", "runtime": "hf-deepspeed", )"
                           R"("plan": "dp=1,zero=3,recompute=full,opt_offload=1,param_offload=1", "published_max_seq_tokens": 32000)";
  auto [unsourced, unsourced_out] = validate_with_maxseq_line("bunsourced", head + R"(, "published_failed_seq_tokens": 40000})");
  EXPECT_EQ(unsourced, 2) << unsourced_out;
  EXPECT_NE(unsourced_out.find("failed_source"), std::string::npos) << unsourced_out;
  EXPECT_NE(unsourced_out.find("alst_maxseq.jsonl"), std::string::npos) << unsourced_out;
  auto [below, below_out] =
      validate_with_maxseq_line("bbelow", head + R"(, "published_failed_seq_tokens": 32000, "failed_source": "x"})");
  EXPECT_EQ(below, 2) << below_out;
  EXPECT_NE(below_out.find("published_failed_seq_tokens"), std::string::npos) << below_out;
  // inside [32000, 40000): no error; with the failure at 36000 the prediction is 37,358 / 36,000 - 1 = +3.8%
  auto [in, in_out] = validate_with_maxseq_line("bin", head + R"(, "published_failed_seq_tokens": 40000, "failed_source": "x"})");
  EXPECT_EQ(in, 0) << in_out;
  EXPECT_NE(in_out.find("0% (in bracket)"), std::string::npos) << in_out;
  auto [above, above_out] = validate_with_maxseq_line("babove", head + R"(, "published_failed_seq_tokens": 36000, "failed_source": "x"})");
  EXPECT_EQ(above, 0) << above_out;
  EXPECT_NE(above_out.find("+3.8%"), std::string::npos) << above_out;
}

}  // namespace
