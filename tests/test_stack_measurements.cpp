// ctxplan compare with the stacks' own measurements (planner/stack_measurements.hpp): Megatron-LM
// iteration and memory log lines, torchtitan metrics lines, a torch.cuda.memory_stats() dump, a CSV.
// The samples in tests/data/stacks are written in each stack's documented log format; the expected
// values below are computed from the sample's own numbers, not from the reader's output.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "costmodel/errors.hpp"
#include "planner/stack_measurements.hpp"
#include "tests/run_process.hpp"

namespace fs = std::filesystem;
using namespace ctx;

namespace {

std::string data(const std::string& name) { return std::string(CTXPLAN_TEST_DATA) + "/stacks/" + name; }
constexpr double kMiB = 1024.0 * 1024.0, kGiB = 1024.0 * kMiB;

const CompareRow* row(const Comparison& c, const std::string& name) {
  for (const CompareRow& r : c.rows)
    if (r.name == name) return &r;
  return nullptr;
}

// A prediction document with round numbers, in the shape `ctxplan predict --json` writes.
json prediction(double step_seconds, double peak_bytes, double runtime_bytes) {
  json cats = json::object();
  for (int i = 0; i < kMemCategories; ++i) cats[to_string(static_cast<Mem>(i))] = 0.0;
  cats["runtime"] = runtime_bytes;
  cats["weights"] = peak_bytes - runtime_bytes;
  const double tokens_per_step = 16.0 * 131072;  // dp 2 x ga 8 x mbs 1 x seq
  return {{"schema", "ctxplan.prediction/1"},
          {"model", "Llama-3.1-8B"},
          {"cluster", "2x8xH100-SXM-80GB"},
          {"runtime", "megatron"},
          {"seq", 131072},
          {"world", 16},
          {"plan", plan_to_json(parse_plan("dp=2,tp=2,cp=4,cp_kind=usp,ulysses=2,zero=1,ga=8,recompute=full"))},
          {"memory", {{"peak_bytes", peak_bytes}, {"by_category", cats}}},
          {"time",
           {{"step_seconds", step_seconds},
            {"tokens_per_second", tokens_per_step / step_seconds},
            {"phases_seconds", {{"forward", step_seconds / 3}, {"backward", 2 * step_seconds / 3}, {"optimizer", 0.0}}},
            {"mfu", 0.4},
            {"model_tflops_per_gpu", 400.0}}}};
}

}  // namespace

TEST(StackMeasurement, MegatronLogGivesMeanStepAfterWarmupAndHighestPeak) {
  auto m = read_stack_measurement(data("megatron_train.log"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->format, "Megatron-LM log");
  EXPECT_EQ(m->steps_read, 4);
  EXPECT_EQ(m->steps_used, 3);  // iteration 1 is warm-up
  EXPECT_NEAR(*m->step_seconds, (47100.0 + 46900.0 + 47000.0) / 3 / 1000, 1e-9);
  EXPECT_EQ(*m->global_batch, 16);
  EXPECT_NEAR(*m->tflops_per_gpu, (210.0 + 211.0 + 209.0) / 3, 1e-9);
  EXPECT_NEAR(*m->peak_allocated_bytes, 61500.25 * kMiB, 1);  // rank 8's, the higher; Megatron's MB = 2^20 bytes
  EXPECT_NEAR(*m->peak_reserved_bytes, 65100.00 * kMiB, 1);
}

TEST(StackMeasurement, TorchtitanLogGivesTokensPerGpuAndReservedMemory) {
  auto m = read_stack_measurement(data("torchtitan_train.log"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->format, "torchtitan log");
  EXPECT_EQ(m->steps_used, 2);
  EXPECT_NEAR(*m->tokens_per_second_per_gpu, (1210.0 + 1190.0) / 2, 1e-9);  // "1,210": thousands separator
  EXPECT_NEAR(*m->mfu, (7.18 + 7.07) / 2 / 100, 1e-12);
  EXPECT_NEAR(*m->peak_reserved_bytes, 61.50 * kGiB, 1);  // torchtitan's "memory" is max reserved
  EXPECT_FALSE(m->peak_allocated_bytes.has_value());
}

TEST(StackMeasurement, MemoryStatsDumpGivesAllocatorPeaks) {
  auto m = read_stack_measurement(data("memory_stats.json"));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(*m->peak_allocated_bytes, 64123456512.0);
  EXPECT_EQ(*m->peak_reserved_bytes, 68719476736.0);
}

TEST(StackMeasurement, CtxrunReportIsLeftToTheReportReader) {
  const fs::path p = fs::temp_directory_path() / ("ctxplan_report_" + std::to_string(::getpid()) + ".json");
  std::ofstream(p) << R"({"schema": "ctxplan.measurement/1"})";
  EXPECT_FALSE(read_stack_measurement(p.string()).has_value());
  fs::remove(p);
}

TEST(StackMeasurement, CsvColumnsAreNamedOrRefused) {
  auto m = read_stack_measurement(data("measured.csv"));
  ASSERT_TRUE(m.has_value());
  EXPECT_NEAR(*m->step_seconds, (9.41 + 9.37) / 2, 1e-12);
  EXPECT_EQ(*m->peak_allocated_bytes, 22011203584.0);
  const fs::path p = fs::temp_directory_path() / ("ctxplan_bad_" + std::to_string(::getpid()) + ".csv");
  std::ofstream(p) << "step,step_secs\n1,2.0\n";
  try {
    read_stack_measurement(p.string());
    ADD_FAILURE() << "an unknown column was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("step_secs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("step_seconds"), std::string::npos) << e.what();
  }
  std::ofstream(p) << "step,step_seconds\n1,abc\n";
  EXPECT_THROW(read_stack_measurement(p.string()), InputError);
  fs::remove(p);
}

TEST(StackMeasurement, ComparesFieldByFieldWithTolerances) {
  auto m = read_stack_measurement(data("megatron_train.log"));
  ASSERT_TRUE(m.has_value());
  const double measured_step = (47100.0 + 46900.0 + 47000.0) / 3 / 1000;
  // a prediction equal to the log: every judged row is within tolerance
  json exact = prediction(measured_step, 61500.25 * kMiB + 1e9, 1e9);
  Comparison c = compare_stack_measurement(exact, "pred.json", *m, {});
  EXPECT_EQ(c.misses, 0);
  ASSERT_NE(row(c, "step"), nullptr);
  EXPECT_NEAR(row(c, "step")->rel_error, 0, 1e-12);
  ASSERT_NE(row(c, "peak (allocated)"), nullptr);  // predicted peak minus its runtime category
  EXPECT_NEAR(row(c, "peak (allocated)")->predicted, 61500.25 * kMiB, 1);
  EXPECT_NEAR(row(c, "tokens/s")->measured, 16.0 * 131072 / measured_step, 1e-6);
  EXPECT_FALSE(row(c, "~peak (reserved)")->judged);
  // 20% slower prediction: the step and tokens/s rows miss, memory does not
  Comparison slow = compare_stack_measurement(prediction(measured_step * 1.2, 61500.25 * kMiB + 1e9, 1e9), "pred.json", *m, {});
  EXPECT_TRUE(row(slow, "step")->miss);
  EXPECT_TRUE(row(slow, "tokens/s")->miss);
  EXPECT_FALSE(row(slow, "peak (allocated)")->miss);
}

TEST(StackMeasurement, GlobalBatchOfAnotherJobIsRefused) {
  auto m = read_stack_measurement(data("megatron_train.log"));
  json other = prediction(47.0, 6e10, 1e9);
  other["plan"] = plan_to_json(parse_plan("dp=2,tp=2,cp=4,cp_kind=usp,ulysses=2,zero=1,ga=4,recompute=full"));
  try {
    compare_stack_measurement(other, "pred.json", *m, {});
    ADD_FAILURE() << "a log of another global batch was compared";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("global batch size"), std::string::npos) << e.what();
  }
  CompareOptions o;
  o.allow_mismatch = true;
  EXPECT_FALSE(compare_stack_measurement(other, "pred.json", *m, o).warnings.empty());
}

TEST(StackMeasurement, CliComparesPredictionWithEachFormat) {
  const fs::path dir = fs::temp_directory_path() / ("ctxplan_sm_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string pred = (dir / "pred.json").string();
  auto r = ctx::testing::run_process(CTXPLAN_BIN, {"predict", "--model", "Llama-3.1-8B", "--cluster", "2x8xh100", "--seq", "131072",
                                                   "--plan", "tp=2,cp=4,cp_kind=usp,ulysses=2,zero=1,ga=8,recompute=full",
                                                   "--runtime", "megatron", "-o", pred});
  ASSERT_TRUE(r.exit_code == 0 || r.exit_code == 3) << r.both();
  for (const char* f : {"megatron_train.log", "torchtitan_train.log", "memory_stats.json", "measured.csv"}) {
    SCOPED_TRACE(f);
    r = ctx::testing::run_process(CTXPLAN_BIN, {"compare", pred, data(f), "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.both();
    json j = json::parse(r.out);
    EXPECT_EQ(j["schema"], "ctxplan.comparison/1");
    EXPECT_FALSE(j["rows"].empty());
  }
  const std::string junk = (dir / "junk.txt").string();
  std::ofstream(junk) << "hello\n";
  r = ctx::testing::run_process(CTXPLAN_BIN, {"compare", pred, junk});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("Megatron-LM"), std::string::npos) << r.err;
  fs::remove_all(dir);
}
