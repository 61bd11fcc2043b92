// The built-in runtimes' calibration on their published fit points (issue 16, docs/VALIDATION.md
// "Calibrating the built-in runtimes on their fit points"). Proves:
//   - each runs file (profiles/validation/calibration/<runtime>.runs.json) holds only fit points of its
//     runtime, one run per point, and its measurement is the published step time or the step the
//     published rate implies (the same conversion `ctxplan validate --json` prints);
//   - an adopted profile's calibration record is current: refitting the prior (the profile with its
//     fitted constants back at 1 and 0) to the runs file gives its constants, and leave-one-out gives its
//     residuals (2% in ln: the record goes stale when the time model moves by more);
//   - `ctxplan validate`'s out-of-sample value of a calibrated fit point is its metric at the record's
//     leave-one-out step; a runtime without a record (torchtitan) has none.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "costmodel/json_util.hpp"
#include "costmodel/profile_store.hpp"
#include "planner/calibrate.hpp"
#include "planner/calibration_runs.hpp"
#include "planner/validation_points.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  return p;
}

std::string runs_file(const std::string& runtime) {
  return std::string(CTXPLAN_SOURCE_DIR) + "/profiles/validation/calibration/" + runtime + ".runs.json";
}

TEST(BuiltinCalibration, RunsFilesHoldOnlyTheRuntimesFitPointsAtTheirPublishedSteps) {
  const std::vector<PublishedTimeRow> rows = predict_published_time(profiles(), "", "");
  for (const char* runtime : {"hf-deepspeed", "megatron", "torchtitan"}) {
    SCOPED_TRACE(runtime);
    const std::vector<CalibrationRun> runs = read_calibration_runs(profiles(), runs_file(runtime));
    ASSERT_GE(runs.size(), 5u);
    std::set<std::string> ids;
    for (const CalibrationRun& run : runs) {
      EXPECT_TRUE(ids.insert(run.id).second) << run.id << " twice";
      EXPECT_EQ(run.runtime_name, runtime);
      int matched = 0;
      for (const PublishedTimeRow& r : rows) {
        if (r.point != run.id || !r.time_metric) continue;
        EXPECT_EQ(r.role, "fit") << r.id << ": a check point in a calibration";
        EXPECT_EQ(r.runtime, runtime) << r.id;
        const double implied = r.predicted_step_seconds * std::exp(r.step_log_ratio);
        // a published step time is the measurement; a rate's implied step where none is published
        if (r.metric == "iteration_time_s" || matched == 0) {
          if (r.metric == "iteration_time_s") {
            EXPECT_DOUBLE_EQ(run.measured_step_seconds, r.published) << r.id;
          }
          else EXPECT_NEAR(run.measured_step_seconds, implied, 1e-6 * implied) << r.id;
        }
        ++matched;
      }
      EXPECT_GE(matched, 1) << run.id << " is no published point";
    }
  }
}

// The profile as it was before its calibration: the fitted scales back at 1, the overhead at 0.
RuntimeProfile uncalibrated(RuntimeProfile rt) {
  rt.gemm_efficiency_scale = rt.attention_efficiency_scale = rt.comm_efficiency_scale = 1;
  rt.step_overhead_seconds = 0;
  rt.time_residuals.clear();
  return rt;
}

TEST(BuiltinCalibration, AnAdoptedRecordIsCurrent) {
  for (const char* runtime : {"hf-deepspeed", "megatron"}) {
    SCOPED_TRACE(runtime);
    const RuntimeProfile& rt = resolve_runtime(profiles(), runtime);
    const json doc = read_json_file(std::string(CTXPLAN_SOURCE_DIR) + "/profiles/runtimes/" + runtime + ".json");
    ASSERT_TRUE(doc.contains("calibration"));
    const std::vector<CalibrationRun> runs = read_calibration_runs(profiles(), runs_file(runtime));
    ASSERT_EQ(rt.time_residuals.size(), runs.size());
    const RuntimeProfile prior = uncalibrated(rt);
    std::vector<size_t> all;
    for (size_t i = 0; i < runs.size(); ++i) all.push_back(i);
    // the parameters the calibration held at the prior by request (ctxplan calibrate --hold)
    CalibrationHeld held{};
    for (const auto& h : doc["calibration"].value("held_by_request", json::array()))
      for (int p = 0; p < kCalParams; ++p)
        if (h.get<std::string>() == calibration_param_name(static_cast<CalParam>(p))) held[p] = true;
    const CalibrationFit fit = fit_calibration(runs, all, prior, held);
    const CalibrationValues now = calibration_values(rt);
    for (int p = 0; p < kCalParams; ++p) {
      if (!fit.fitted[p]) continue;
      const double want = now.value[p], got = fit.values.value[p];
      if (static_cast<CalParam>(p) == CalParam::overhead) {
        EXPECT_NEAR(got, want, 0.02 * want + 1e-6);
      }
      else EXPECT_NEAR(std::log(got / want), 0.0, 0.02) << to_string(static_cast<CalParam>(p));
    }
    const std::vector<double> loo = leave_one_out_log_ratios(runs, prior, held);
    for (size_t i = 0; i < runs.size(); ++i) {
      EXPECT_EQ(rt.time_residuals[i].id, runs[i].id);
      EXPECT_NEAR(rt.time_residuals[i].log_ratio, loo[i], 0.02) << runs[i].id;
      EXPECT_DOUBLE_EQ(rt.time_residuals[i].measured_step_seconds, runs[i].measured_step_seconds) << runs[i].id;
    }
  }
  EXPECT_TRUE(resolve_runtime(profiles(), "torchtitan").time_residuals.empty()) << "torchtitan's calibration was not adopted";
}

TEST(BuiltinCalibration, ValidateGivesACalibratedFitPointItsLeaveOneOutMetric) {
  const RuntimeProfile& mg = resolve_runtime(profiles(), "megatron");
  std::map<std::string, TimeResidual> record;
  for (const TimeResidual& t : mg.time_residuals) record[t.id] = t;
  int seen = 0;
  for (const PublishedTimeRow& r : predict_published_time(profiles(), "", "")) {
    if (r.runtime == "torchtitan" || r.role == "check" || !r.time_metric) {
      EXPECT_FALSE(r.leave_one_out) << r.id;
      EXPECT_DOUBLE_EQ(r.predicted_out_of_sample, r.predicted) << r.id;
      continue;
    }
    if (r.runtime != "megatron") continue;
    ASSERT_TRUE(record.count(r.point)) << r.id;
    const TimeResidual& t = record[r.point];
    // NeMo's model TFLOPS is inverse to the step: at the leave-one-out step measured / exp(residual)
    const double loo_step = t.measured_step_seconds / std::exp(t.log_ratio);
    EXPECT_TRUE(r.leave_one_out);
    EXPECT_NEAR(r.predicted_out_of_sample, r.predicted * r.predicted_step_seconds / loo_step, 1e-9 * r.predicted) << r.id;
    ++seen;
  }
  EXPECT_EQ(seen, 5);
}

}  // namespace
}  // namespace ctx
