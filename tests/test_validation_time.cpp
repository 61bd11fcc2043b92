// Step time against published measurements (profiles/validation/published_time.jsonl), through
// `ctxplan validate --json`, each metric computed the way its source defines it (ALST's Megatron
// TFLOPS with non-causal attention and recompute, NeMo model TFLOPS, llm-foundry MFU, tokens/s).
// Tolerances (stated, and docs/VALIDATION.md explains the misses):
//   - attention-dominated ALST runs (>= 500K tokens, FA2, Ulysses): step time within 15%
//   - NeMo Llama-2-7B weak scaling 4K..1M with CP (TFLOPS): within 10%
//   - every point: the prediction is within a factor of 2.5 (no wild misses)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

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

TEST(ValidationTime, AttentionDominatedAlstStepTimeWithin15Percent) {
  int checked = 0;
  for (auto& r : rows()) {
    std::string id = r.at("id");
    if (id.rfind("alst-", 0) != 0 || r.at("metric") != "iteration_time_s") continue;
    if (r.at("published").get<double>() < 500) continue;  // the >= 500K-token runs take 500+ s
    EXPECT_NEAR(r.at("predicted").get<double>() / r.at("published").get<double>(), 1.0, 0.15) << id;
    ++checked;
  }
  EXPECT_GE(checked, 6);
}

TEST(ValidationTime, NemoContextParallelTflopsWithin10Percent) {
  int checked = 0;
  for (auto& r : rows()) {
    std::string id = r.at("id");
    if (id.rfind("nemo-", 0) != 0) continue;
    EXPECT_NEAR(r.at("predicted").get<double>() / r.at("published").get<double>(), 1.0, 0.10) << id;
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

TEST(ValidationTime, NoPointOffByMoreThan2_5x) {
  for (auto& r : rows()) {
    double ratio = r.at("predicted").get<double>() / r.at("published").get<double>();
    EXPECT_GT(ratio, 1 / 2.5) << r.at("id");
    EXPECT_LT(ratio, 2.5) << r.at("id");
  }
}

}  // namespace
