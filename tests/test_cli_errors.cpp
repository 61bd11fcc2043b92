// The ctxplan binary on bad input: every mistake a person makes on the command line or in a file
// exits 2 (costmodel/exit_codes.hpp) with a message that names where the mistake is and what would
// be valid; a plan that does not fit exits 3; a good job exits 0. Each test runs the real binary
// (CTXPLAN_BIN) in a child process and captures stdout, stderr and the exit code.
#include <fcntl.h>
#include <gtest/gtest.h>

#include "tests/run_process.hpp"
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "costmodel/exit_codes.hpp"

namespace {

using ctx::testing::RunResult;
using ctx::testing::slurp;

RunResult run_ctxplan(const std::vector<std::string>& args) { return ctx::testing::run_process(CTXPLAN_BIN, args); }

std::string data(const std::string& rel) { return std::string(CTXPLAN_TEST_DATA) + "/" + rel; }

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// 1-based line and column of the first occurrence of `needle` in a file, found by scanning the text.
std::pair<int, int> line_col_of(const std::string& text, const std::string& needle, size_t offset_in_needle) {
  size_t at = text.find(needle);
  EXPECT_NE(at, std::string::npos) << "test data does not contain " << needle;
  at += offset_in_needle;
  int line = 1, col = 1;
  for (size_t i = 0; i < at; ++i) {
    if (text[i] == '\n') { ++line; col = 1; } else { ++col; }
  }
  return {line, col};
}

#define EXPECT_HAS(text, needle) EXPECT_TRUE(contains(text, needle)) << "missing \"" << (needle) << "\" in:\n" << (text)

}  // namespace

// ---- malformed files ----------------------------------------------------------------------

TEST(CliErrors, MalformedPlanFileNamesFileLineAndColumn) {
  std::string path = data("bad_syntax_plan.json");
  // The trailing comma `4,}` is the error: the parser fails on the '}' that follows it.
  auto [line, col] = line_col_of(slurp(path), "4,}", 2);
  ASSERT_EQ(line, 3);
  RunResult r = run_ctxplan({"predict", "--plan-file", path});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, path + ":" + std::to_string(line) + ":" + std::to_string(col));
  EXPECT_HAS(r.err, "malformed JSON");
}

TEST(CliErrors, MalformedModelConfigNamesFileLineAndColumn) {
  std::string path = data("hf_bad_syntax/config.json");
  // A comma is missing after `"hidden_size": 4096`; the offending token is the next key,
  // the string literal "intermediate_size" on line 4. The reported column must point into it
  // (nlohmann reports where it stopped reading the token: its closing quote).
  const std::string token = "\"intermediate_size\"";
  auto [line, first_col] = line_col_of(slurp(path), token, 0);
  int last_col = first_col + static_cast<int>(token.size()) - 1;
  ASSERT_EQ(line, 4);
  RunResult r = run_ctxplan({"predict", "--model", path});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "malformed JSON");
  size_t at = r.err.find(path + ":");
  ASSERT_NE(at, std::string::npos) << r.err;
  int got_line = 0, got_col = 0;
  ASSERT_EQ(std::sscanf(r.err.c_str() + at + path.size(), ":%d:%d:", &got_line, &got_col), 2) << r.err;
  EXPECT_EQ(got_line, line);
  EXPECT_GE(got_col, first_col) << r.err;
  EXPECT_LE(got_col, last_col) << r.err;
}

TEST(CliErrors, HfConfigMissingLayersNamesKeyAndFile) {
  std::string path = data("hf_missing_layers/config.json");
  RunResult r = run_ctxplan({"predict", "--model", path});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "num_hidden_layers");
  EXPECT_HAS(r.err, path);
  EXPECT_HAS(r.err, "missing");
}

TEST(CliErrors, HfConfigFolderIsAcceptedAsModel) {
  // A folder holding config.json is a model argument (the same as passing the file).
  RunResult r = run_ctxplan({"predict", "--model", data("hf_llama8b")});
  EXPECT_EQ(r.exit_code, ctx::kExitOk) << r.both();
  EXPECT_HAS(r.out, "FITS");
}

// ---- unknown names ------------------------------------------------------------------------

TEST(CliErrors, UnknownModelSuggestsClosestName) {
  RunResult r = run_ctxplan({"predict", "--model", "llama-3.1-8x"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "unknown model 'llama-3.1-8x'");
  EXPECT_HAS(r.err, "did you mean");
  // One edit away from the profile name (and from its alias llama-3.1-8b-instruct's prefix).
  EXPECT_HAS(lower(r.err), "llama-3.1-8b");
}

TEST(CliErrors, UnknownClusterSuggestsNameAndShorthand) {
  RunResult r = run_ctxplan({"predict", "--cluster", "dgx-h1000"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "unknown cluster 'dgx-h1000'");
  EXPECT_HAS(r.err, "did you mean");
  EXPECT_HAS(r.err, "dgx-h100");
  EXPECT_HAS(r.err, "<nodes>x<gpus per node>x<gpu>");
}

TEST(CliErrors, UnknownGpuInShorthandSuggestsH100) {
  RunResult r = run_ctxplan({"predict", "--cluster", "8xh10O"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "unknown GPU 'h10O'");
  EXPECT_HAS(r.err, "8xh10O");
  EXPECT_HAS(r.err, "did you mean 'h100'");  // one substitution (O -> 0) from the alias h100
}

TEST(CliErrors, UnknownPlanKeySuggestsTp) {
  RunResult r = run_ctxplan({"predict", "--plan", "tpp=2"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "--plan");
  EXPECT_HAS(r.err, "unknown plan key");
  EXPECT_HAS(r.err, "did you mean 'tp'");
}

// ---- bad plan values ----------------------------------------------------------------------

TEST(CliErrors, NegativeCpIsOutOfRange) {
  RunResult r = run_ctxplan({"predict", "--plan", "cp=-2"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "field 'cp'");
  EXPECT_HAS(r.err, "out of range");
}

TEST(CliErrors, UnknownCpKindListsValidKinds) {
  RunResult r = run_ctxplan({"predict", "--plan", "cp=8,cp_kind=foo"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "field 'cp_kind'");
  EXPECT_HAS(r.err, "'foo'");
  for (const char* k : {"ring", "zigzag", "allgather", "ulysses", "usp"}) EXPECT_HAS(r.err, k);
}

TEST(CliErrors, ZeroStageFiveIsOutOfRange) {
  RunResult r = run_ctxplan({"predict", "--plan", "zero=5"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "field 'zero'");
  EXPECT_HAS(r.err, "0..3");
}

// ---- absurd sequence lengths --------------------------------------------------------------

TEST(CliErrors, SeqZeroIsRejected) {
  RunResult r = run_ctxplan({"predict", "--seq", "0"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "--seq");
  EXPECT_HAS(r.err, "1..17179869184");
}

TEST(CliErrors, SeqNegativeIsRejected) {
  RunResult r = run_ctxplan({"predict", "--seq", "-5"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "--seq");
  EXPECT_HAS(r.err, "-5");
}

TEST(CliErrors, SeqBeyondSixteenGiTokensIsRejected) {
  RunResult r = run_ctxplan({"predict", "--seq", "99999999999999"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "--seq");
  EXPECT_HAS(r.err, "99999999999999");
  EXPECT_HAS(r.err, "1..17179869184");
}

TEST(CliErrors, SeqNotANumberIsRejected) {
  RunResult r = run_ctxplan({"predict", "--seq", "abc"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "--seq");
  EXPECT_HAS(r.err, "'abc'");
  EXPECT_HAS(r.err, "128k");  // shows what a valid value looks like
}

// ---- plans that cannot run ----------------------------------------------------------------

TEST(CliErrors, WorldSizeMismatchGivesNearestDp) {
  // 8 GPUs with tp=2, cp=1: the only dp that fills them is 8/(2*1) = 4.
  RunResult r = run_ctxplan({"predict", "--cluster", "8xh100", "--plan", "dp=3,tp=2,cp=1"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "dp*tp*cp");
  EXPECT_HAS(r.err, "8 GPUs");
  EXPECT_HAS(r.err, "nearest valid");
  EXPECT_HAS(r.err, "dp=4");
}

TEST(CliErrors, UlyssesDegreeMustDivideQueryHeads) {
  // Llama-3.1-8B has 32 query heads; 32 % 6 != 0. The seq 122880 = 6 * 20480 splits evenly, so the
  // heads are the only problem. Nearest valid Ulysses degrees dividing 32: 4 and 8.
  RunResult r = run_ctxplan(
      {"predict", "--cluster", "6xh100", "--seq", "122880", "--plan", "cp=6,cp_kind=ulysses,zero=3,recompute=full"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "Ulysses degree 6");
  EXPECT_HAS(r.err, "32 query heads");
  EXPECT_HAS(r.err, "cp=4");
  EXPECT_HAS(r.err, "cp=8");
}

TEST(CliErrors, UlyssesDegreeEightIsAcceptedForLlama8B) {
  // 8 divides the 32 query heads and equals the 8 KV heads: a valid plan (exit 0 or 3, never 2).
  RunResult r = run_ctxplan({"predict", "--cluster", "8xh100", "--plan", "cp=8,cp_kind=ulysses,zero=3,recompute=full"});
  EXPECT_TRUE(r.exit_code == ctx::kExitOk || r.exit_code == ctx::kExitDoesNotFit) << r.both();
  EXPECT_FALSE(contains(r.err, "error")) << r.err;
}

TEST(CliErrors, ZigZagNeedsSeqDivisibleByTwoCpAndSuggestsNearestSeq) {
  // zig-zag over cp=8 cuts the sequence into 2*8 = 16 chunks; 131000 = 16*8187 + 8, so the
  // nearest valid lengths are 16*8187 = 130992 and 16*8188 = 131008.
  RunResult r = run_ctxplan({"predict", "--seq", "131000", "--plan", "cp=8,cp_kind=zigzag,zero=3,recompute=full"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "2*cp = 16");
  EXPECT_HAS(r.err, "--seq 130992");
  EXPECT_HAS(r.err, "--seq 131008");
}

TEST(CliErrors, CheckpointOffloadNeedsFullRecompute) {
  RunResult r = run_ctxplan({"predict", "--plan", "cp=8,zero=3,ckpt_offload=1,recompute=selective"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "ckpt_offload");
  EXPECT_HAS(r.err, "recompute=full");
}

TEST(CliErrors, PlanAndPlanFileTogetherAreRejected) {
  std::string path = "/tmp/ctxplan_test_plan_" + std::to_string(getpid()) + ".json";
  {
    std::ofstream f(path);
    f << R"({"schema": "ctxplan.plan/1", "plan": {"cp": 8, "zero": 3, "recompute": "full"}})";
  }
  RunResult r = run_ctxplan({"predict", "--plan-file", path, "--plan", "cp=8"});
  unlink(path.c_str());
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(r.err, "not both");
}

TEST(CliErrors, PlanFileWithNonStringCpKindIsBadInput) {
  // "cp_kind": 5 next to "ulysses": a wrong type in a file is bad input (exit 2), not an internal error.
  std::string path = data("plan_cp_kind_number.json");
  RunResult r = run_ctxplan({"predict", "--plan-file", path});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
  EXPECT_HAS(r.err, path);
  EXPECT_HAS(r.err, "cp_kind");
}

TEST(CliErrors, PlanFileSuppliesModelAndCluster) {
  RunResult r = run_ctxplan({"predict", "--plan-file", data("plan_70b_4x8.json")});
  EXPECT_TRUE(r.exit_code == ctx::kExitOk || r.exit_code == ctx::kExitDoesNotFit) << r.both();
  EXPECT_HAS(r.out, "Llama-3.1-70B on");
  EXPECT_HAS(r.out, "(32 x H100");
}

TEST(CliErrors, ExplicitModelFlagOverridesPlanFile) {
  // "the file's model/cluster/seq apply unless given on the command line": an explicit --model wins
  // even when it happens to name the built-in default model.
  RunResult r = run_ctxplan({"predict", "--plan-file", data("plan_70b_4x8.json"), "--model", "Llama-3.1-8B"});
  EXPECT_TRUE(r.exit_code == ctx::kExitOk || r.exit_code == ctx::kExitDoesNotFit) << r.both();
  EXPECT_HAS(r.out, "Llama-3.1-8B on");
}

// ---- verdicts -----------------------------------------------------------------------------

TEST(CliErrors, SeventyBOnOneH100DoesNotFit) {
  // 70B parameters in bf16 are ~140 GB of weights alone, far above one 80 GB H100.
  RunResult r = run_ctxplan(
      {"predict", "--model", "Llama-3.1-70B", "--cluster", "1xh100", "--seq", "128k", "--plan", "recompute=none"});
  EXPECT_EQ(r.exit_code, ctx::kExitDoesNotFit) << r.both();
  EXPECT_HAS(r.out, "DOES NOT FIT");
}

TEST(CliErrors, DefaultJobFits) {
  RunResult r = run_ctxplan({});
  EXPECT_EQ(r.exit_code, ctx::kExitOk) << r.both();
  EXPECT_HAS(r.out, "FITS");
  EXPECT_FALSE(contains(r.out, "DOES NOT FIT"));
}

TEST(CliErrors, JsonOutputParsesWithSchemaAndCategories) {
  RunResult r = run_ctxplan({"predict", "--json"});
  ASSERT_EQ(r.exit_code, ctx::kExitOk) << r.both();
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.out;
  EXPECT_EQ(j.at("schema"), "ctxplan.prediction/1");
  ASSERT_TRUE(j.at("memory").contains("by_category"));
  const auto& cats = j["memory"]["by_category"];
  ASSERT_TRUE(cats.is_object());
  for (const char* k : {"weights", "grads", "optimizer", "activations"}) EXPECT_TRUE(cats.contains(k)) << k;
  // The breakdown at the peak adds up to the peak.
  double sum = 0;
  for (auto& [k, v] : cats.items()) sum += v.get<double>();
  EXPECT_NEAR(sum, j["memory"]["peak_bytes"].get<double>(), 1.0);
  EXPECT_EQ(j.at("fits"), true);
}

TEST(CliErrors, HelpOnEverySubcommandShowsExamples) {
  for (const char* sub : {"predict", "list", "show"}) {
    RunResult r = run_ctxplan({sub, "--help"});
    EXPECT_EQ(r.exit_code, ctx::kExitOk) << sub;
    EXPECT_HAS(r.out, "Examples") ;
  }
}
