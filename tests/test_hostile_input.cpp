// Hostile input to the shared JSON reader (issue 17): every class of bad file a fuzzer or a hostile
// user produces ends in exit 2 with a message naming the file (line and column where the text is
// at fault) and the field, never a crash, an "internal error" or a silently accepted value.
// One test per class; each failed before the reader was fixed (the comment says how).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "costmodel/exit_codes.hpp"
#include "costmodel/json_util.hpp"
#include "costmodel/limits.hpp"
#include "costmodel/plan.hpp"
#include "tests/run_process.hpp"

namespace fs = std::filesystem;
using ctx::testing::RunResult;

namespace {

RunResult run_ctxplan(const std::vector<std::string>& args) { return ctx::testing::run_process(CTXPLAN_BIN, args); }

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }
#define EXPECT_HAS(text, needle) EXPECT_TRUE(contains(text, needle)) << "missing \"" << (needle) << "\" in:\n" << (text)

// A plan file (schema ctxplan.plan/1) whose `seq` line is given verbatim; seq sits on line 3.
std::string plan_file_with(const std::string& name, const std::string& seq_value, const std::string& plan = "{\"tp\": 8}") {
  fs::path dir = fs::temp_directory_path() / ("ctxplan_hostile_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string path = (dir / name).string();
  std::ofstream(path) << "{\"schema\": \"ctxplan.plan/1\", \"model\": \"Llama-3.1-8B\", \"cluster\": \"1x8xh100\",\n"
                      << "  \"plan\": " << plan << ",\n"
                      << "  \"seq\": " << seq_value << "\n}\n";
  return path;
}

}  // namespace

// Before: 60,000 levels of [[[...]]] in a scalar field segfaulted (the type error dumped the value
// recursively). Now the reader refuses nesting beyond kJsonMaxDepth, at the line and column where it
// passes the limit.
TEST(HostileInput, DeepNestingIsRefusedWithLineAndColumnNotACrash) {
  const std::string path = plan_file_with("deep.json", std::string(60000, '[') + std::string(60000, ']'));
  RunResult r = run_ctxplan({"predict", "--plan-file", path});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.err.substr(0, 2000);
  // line 3, column 10 is the first '['; the limit is passed kJsonMaxDepth - 1 brackets later
  // (the document's own '{' is level 1)
  EXPECT_HAS(r.err, path + ":3:" + std::to_string(10 + ctx::kJsonMaxDepth - 1));
  EXPECT_HAS(r.err, "nested deeper than " + std::to_string(ctx::kJsonMaxDepth));
  EXPECT_LT(r.err.size(), 1000u);
}

// Before: `1e400` exited 1 "internal error" (nlohmann's out_of_range escaped) without the file.
TEST(HostileInput, NumberBeyondDoubleNamesFileLineColumnAndField) {
  const std::string path = plan_file_with("overflow.json", "1e400");
  RunResult r = run_ctxplan({"predict", "--plan-file", path});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
  EXPECT_HAS(r.err, path + ":3:");
  EXPECT_HAS(r.err, "field 'seq'");
  EXPECT_HAS(r.err, "1e400");
  EXPECT_HAS(r.err, "beyond the range of a double");
}

// Before: a key given twice in the plan object was taken silently (the last one won), while the
// plan string refuses `tp=2,tp=4`.
TEST(HostileInput, DuplicateKeyInPlanObjectIsRefused) {
  const std::string path = plan_file_with("dup.json", "131072", "{\"tp\": 2, \"cp\": 1, \"tp\": 8}");
  RunResult r = run_ctxplan({"predict", "--plan-file", path});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
  EXPECT_HAS(r.err, path);
  EXPECT_HAS(r.err, "field 'plan.tp'");
  EXPECT_HAS(r.err, "'tp' appears twice");
}

// Before: a value of the wrong type was quoted whole: a 20,000-element array became a 40 KB message.
TEST(HostileInput, WrongTypeMessageQuotesABoundedExcerpt) {
  std::string big = "[0";
  for (int i = 0; i < 20000; ++i) big += ",0";
  big += "]";
  const std::string path = plan_file_with("big.json", big);
  RunResult r = run_ctxplan({"predict", "--plan-file", path});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.err.substr(0, 2000);
  EXPECT_HAS(r.err, "field 'seq'");
  EXPECT_HAS(r.err, "[0,0,0");
  EXPECT_HAS(r.err, "...");
  EXPECT_LT(r.err.size(), 200 + path.size() + ctx::kJsonExcerptChars);
}

// Before: a folder given as --plan-file said "malformed JSON".
TEST(HostileInput, FolderWhereAFileIsExpectedSaysFolder) {
  fs::path dir = fs::temp_directory_path() / ("ctxplan_hostile_dir_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  RunResult r = run_ctxplan({"predict", "--plan-file", dir.string()});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
  EXPECT_HAS(r.err, dir.string());
  EXPECT_HAS(r.err, "is a folder");
  EXPECT_FALSE(contains(r.err, "malformed"));
}

// Before: an unsigned beyond int64 (18446744073709551615) was wrapped to -1 by get<int64_t>(), and a
// float beyond int64 was cast before any check (undefined behaviour). Now neither is an integer.
TEST(HostileInput, IntegerReaderRefusesValuesBeyondInt64) {
  for (const char* text : {R"({"n": 18446744073709551615})", R"({"n": 9223372036854775808})", R"({"n": 1e19})",
                           R"({"n": -1e19})", R"({"n": 2.5})"}) {
    ctx::json j = ctx::parse_json_text(text, "t.json");
    ctx::JsonReader r(j, "t.json");
    EXPECT_THROW(r.integer("n"), ctx::InputError) << text;
    EXPECT_FALSE(ctx::json_exact_integer(j["n"]).has_value()) << text;
  }
  // the extremes that are integers stay integers
  ctx::json j = ctx::parse_json_text(R"({"a": 9223372036854775807, "b": -9223372036854775808, "c": 4096.0})", "t");
  ctx::JsonReader r(j, "t");
  EXPECT_EQ(r.integer("a"), INT64_MAX);
  EXPECT_EQ(r.integer("b"), INT64_MIN);
  EXPECT_EQ(r.integer("c"), 4096);
}

// The reader's error for a syntax error inside a nested field names that field too.
TEST(HostileInput, SyntaxErrorNamesTheFieldItIsIn) {
  try {
    ctx::parse_json_text("{\"a\": {\"b\": [1, 2, }}", "x.json");
    FAIL() << "no error";
  } catch (const ctx::InputError& e) {
    EXPECT_EQ(e.field.substr(0, 4), "a.b[");
    EXPECT_EQ(e.where, "x.json:1:20");
  }
}

// ---- runaway sizes: refused naming the bound (costmodel/limits.hpp) -------------------------------

// Before: `plan` on a 1,048,576-node cluster ran 63 s and `sweep --gpus 1000000000` ran away.
TEST(HostileInput, ClusterBeyondTheGpuBoundIsRefusedNamingIt) {
  RunResult plan = run_ctxplan({"plan", "--model", "Llama-3.1-8B", "--cluster", "1048576x8xh100", "--seq", "1m"});
  EXPECT_EQ(plan.exit_code, ctx::kExitBadInput) << plan.both();
  EXPECT_HAS(plan.err, "--cluster");
  EXPECT_HAS(plan.err, "1.." + std::to_string(ctx::kMaxClusterGpus));
  RunResult sweep = run_ctxplan({"sweep", "--model", "tiny", "--cluster", "8xh100", "--seqs", "4k", "--gpus", "1000000000"});
  EXPECT_EQ(sweep.exit_code, ctx::kExitBadInput) << sweep.both();
  EXPECT_HAS(sweep.err, "--gpus");
  EXPECT_HAS(sweep.err, "1.." + std::to_string(ctx::kMaxClusterGpus));
  // the bound itself is accepted: a cluster of exactly kMaxClusterGpus GPUs
  RunResult edge = run_ctxplan({"predict", "--model", "Llama-3.1-8B", "--cluster",
                                std::to_string(ctx::kMaxClusterGpus / 8) + "x8xh100", "--seq", "128k", "--plan", "tp=8"});
  EXPECT_NE(edge.exit_code, ctx::kExitBadInput) << edge.both();
}

// Before: `--gpus 0` said "token count must be 1..17179869184".
TEST(HostileInput, GpuCountZeroSpeaksOfGpus) {
  RunResult r = run_ctxplan({"maxseq", "--model", "tiny", "--cluster", "8xh100", "--gpus", "0"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
  EXPECT_HAS(r.err, "GPU counts");
  EXPECT_FALSE(contains(r.err, "token"));
}

// Before: `maxseq --gpus 12` on nodes of 8 planned on 16 GPUs and labelled the row 12.
TEST(HostileInput, MaxseqRowsNameTheGpusPlannedOn) {
  RunResult r = run_ctxplan({"maxseq", "--model", "tiny", "--cluster", "4x8xh100", "--gpus", "12", "--max", "64k", "--json"});
  ASSERT_EQ(r.exit_code, ctx::kExitOk) << r.both();
  ctx::json j = ctx::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 1u);
  EXPECT_EQ(j["rows"][0]["gpus"], 16);
  EXPECT_EQ(j["rows"][0]["gpus_requested"], 12);
}

// Before: strtod took `tp=0x2`, `tp=1e0` and `--seq 0x100`.
TEST(HostileInput, CountsAreDecimalIntegersWithTheDocumentedSuffixesOnly) {
  for (const char* plan : {"tp=0x2", "tp=1e0", "tp= 2", "tp=inf", "cp=nan"}) {
    RunResult r = run_ctxplan({"predict", "--plan", plan});
    EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << plan << ": " << r.both();
    EXPECT_HAS(r.err, "decimal integer");
  }
  RunResult seq = run_ctxplan({"predict", "--seq", "0x100"});
  EXPECT_EQ(seq.exit_code, ctx::kExitBadInput) << seq.both();
  EXPECT_HAS(seq.err, "--seq");
  // the documented forms stay valid
  RunResult ok = run_ctxplan({"predict", "--seq", "128k", "--plan", "tp=8"});
  EXPECT_NE(ok.exit_code, ctx::kExitBadInput) << ok.both();
}

// Before: `launch --cpus-per-rank=0` and `--time 99:99:99` were accepted.
TEST(HostileInput, LaunchRefusesZeroCpusAndImpossibleTimes) {
  const std::vector<std::string> job = {"launch", "--model", "tiny", "--cluster", "1x2xh100", "--seq", "256", "--plan", "tp=2",
                                        "--backend", "cpu", "--local"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = job;
    a.insert(a.end(), extra.begin(), extra.end());
    return run_ctxplan(a);
  };
  const std::string sbatch = (fs::temp_directory_path() / ("ctxplan_hostile_" + std::to_string(::getpid()) + ".sbatch")).string();
  RunResult zero = with({"--cpus-per-rank", "0"});
  EXPECT_EQ(zero.exit_code, ctx::kExitBadInput) << zero.both();
  EXPECT_HAS(zero.err, "--cpus-per-rank");
  for (const char* t : {"99:99:99", "1-24:00:00", "10:60", "1:2:3:4"}) {
    RunResult r = with({"--time", t, "--slurm", sbatch});
    EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << t << ": " << r.both();
    EXPECT_HAS(r.err, "--time");
  }
  for (const char* t : {"90", "02:00:00", "1-12:00:00", "48:00:00", "2-0"}) {
    RunResult r = with({"--time", t, "--slurm", sbatch});
    EXPECT_EQ(r.exit_code, ctx::kExitOk) << t << ": " << r.both();
  }
}

// Found by fuzz_plan_string (tests/fuzz/regressions/fuzz_plan_string/usp-without-ulysses-round-trip):
// `cp_kind=usp` without `ulysses=` printed as `...,ulysses=0`, which the parser refuses (1..).
TEST(HostileInput, UspPlanWithoutUlyssesDegreeRoundTrips) {
  const ctx::Plan p = ctx::parse_plan(",cp_kind=usp,", "--plan");
  const std::string s = ctx::plan_to_string(p);
  EXPECT_EQ(s.find("ulysses=0"), std::string::npos) << s;
  EXPECT_EQ(ctx::plan_to_string(ctx::parse_plan(s, "round-trip")), s);
  EXPECT_EQ(ctx::plan_to_string(ctx::plan_from_json(ctx::plan_to_json(p), "round-trip")), s);
}

// Before: a model path that is not UTF-8 made `predict --json` and `--out` exit 1 (nlohmann's
// type_error 316 from dump()). The shared writer (json_dump) writes U+FFFD for such bytes.
TEST(HostileInput, ModelPathThatIsNotUtf8IsWrittenWithReplacementCharacters) {
  fs::path dir = fs::temp_directory_path() / ("ctxplan_hostile_bad\xff" "name_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(std::string(CTXPLAN_TEST_DATA) + "/hf_llama8b/config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  const std::string out = (fs::temp_directory_path() / ("ctxplan_hostile_pred_" + std::to_string(::getpid()) + ".json")).string();
  RunResult r = run_ctxplan({"predict", "--model", dir.string(), "--cluster", "8xh100", "--seq", "8k", "--plan", "tp=8",
                             "--json", "--out", out});
  ASSERT_EQ(r.exit_code, ctx::kExitOk) << r.err;
  for (const std::string& text : {r.out, ctx::testing::slurp(out)}) {
    ctx::json j;
    ASSERT_NO_THROW(j = ctx::json::parse(text));
    EXPECT_NE(j.dump().find("\xEF\xBF\xBD"), std::string::npos) << "no U+FFFD where the 0xFF byte was";
  }
}
