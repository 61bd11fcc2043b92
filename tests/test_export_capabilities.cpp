// `ctxplan export` consults the target stack's capabilities (issue 21): a plan the stack cannot run
// (missing_capability of its runtime profile: megatron, torchtitan, hf-deepspeed for DeepSpeed and
// ArcticTraining) is refused with the capability's own message, exit 2, as predict refuses it; with
// --any-runtime the file is written and the message is a warning. A plan the stack runs exports as before.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "costmodel/plan.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_capabilities.hpp"
#include "planner/stacks.hpp"
#include "built_in_profiles.hpp"

namespace ctx {
namespace {

const Profiles& profiles() { return testing::built_in_profiles(); }
testing::RunResult ctxplan(std::vector<std::string> args) { return testing::ctxplan_with_built_in_profiles(std::move(args)); }

std::string missing(const char* runtime, const std::string& plan) {
  return missing_capability(resolve_runtime(profiles(), runtime).capabilities, runtime, parse_plan(plan));
}

TEST(ExportCapabilities, EachStackIsJudgedByItsRuntimeProfile) {
  EXPECT_STREQ(stack_runtime(Stack::megatron), "megatron");
  EXPECT_STREQ(stack_runtime(Stack::torchtitan), "torchtitan");
  EXPECT_STREQ(stack_runtime(Stack::deepspeed), "hf-deepspeed");
  EXPECT_STREQ(stack_runtime(Stack::arctic), "hf-deepspeed");
}

TEST(ExportCapabilities, APlanTheStackCannotRunIsRefusedNamingTheCapability) {
  struct Case {
    const char* stack;
    const char* runtime;
    const char* plan;
  };
  // hf-deepspeed runs no tensor parallelism; Megatron's CP runs head-tail layouts only (a contiguous
  // ring is not one of them); torchtitan keeps activation checkpoints on the device
  const Case cases[] = {{"deepspeed", "hf-deepspeed", "tp=2,cp=4,cp_kind=ulysses,zero=3"},
                        {"arctic", "hf-deepspeed", "tp=2,cp=4,cp_kind=ulysses,zero=3"},
                        {"megatron", "megatron", "cp=8,cp_kind=ring,zero=1"},
                        {"torchtitan", "torchtitan", "cp=8,cp_kind=allgather,zero=3,recompute=full,ckpt_offload=1"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.stack) + " " + c.plan);
    const std::string why = missing(c.runtime, c.plan);
    ASSERT_FALSE(why.empty()) << "the case must be one the stack cannot run";
    const std::vector<std::string> args = {"export", c.stack, "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", "128k", "--plan", c.plan};
    const auto refused = ctxplan(args);
    EXPECT_EQ(refused.exit_code, 2) << refused.both();
    EXPECT_NE(refused.err.find(why), std::string::npos) << refused.err;
    EXPECT_NE(refused.err.find("--any-runtime"), std::string::npos) << refused.err;
    EXPECT_TRUE(refused.out.empty()) << "no file is written: " << refused.out;
    std::vector<std::string> anyway = args;
    anyway.push_back("--any-runtime");
    const auto written = ctxplan(anyway);
    EXPECT_EQ(written.exit_code, 0) << written.both();
    EXPECT_NE(written.err.find("warning: " + why), std::string::npos) << written.err;
    EXPECT_FALSE(written.out.empty());
  }
}

TEST(ExportCapabilities, APlanTheStackRunsExportsWithoutAWarning) {
  const char* plan = "cp=8,cp_kind=ulysses,zero=3,recompute=full";
  ASSERT_EQ(missing("hf-deepspeed", plan), "");
  const auto r = ctxplan({"export", "deepspeed", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", "128k", "--plan", plan});
  EXPECT_EQ(r.exit_code, 0) << r.both();
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace ctx
