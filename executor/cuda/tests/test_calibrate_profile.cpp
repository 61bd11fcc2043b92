// ctxrun-calibrate's profile writer, on synthetic measurements (no GPU needed): what it writes is
// read back by the cost model's own loader, the measured curves are the measurements' efficiencies,
// and every field it does not measure is the base profile's.
#include <gtest/gtest.h>

#include <cmath>

#include "costmodel/profile_store.hpp"
#include "executor/cuda/calibrate_profile.hpp"

using namespace ctx;
using namespace ctx::exec;

namespace {

json h200() { return read_json_file(std::string(CTXPLAN_SOURCE_DIR) + "/profiles/hardware/h200-141gb.json"); }

calib::Measurements synthetic() {
  calib::Measurements m;
  m.device_name = "Test GPU";
  m.sm = 90;
  m.driver = "CUDA driver 13.0";
  m.total_bytes = 143771.0 * 1048576;
  m.free_bytes = 143000.0 * 1048576;
  // 2*1024^3 FLOP in 10 us -> 214.7 TFLOP/s
  m.gemm.push_back({1024, 1024, 1024, "bf16", 10e-6});
  m.gemm.push_back({4096, 4096, 4096, "bf16", 200e-6});
  m.gemm.push_back({256, 256, 256, "bf16", 5e-6});
  m.gemm.push_back({4096, 4096, 4096, "fp32", 3e-3});
  m.device_copy.push_back({2.0 * 1048576, 1e-6});
  m.device_copy.push_back({512.0 * 1048576, 130e-6});
  m.h2d_bytes_per_second = 53e9;
  m.d2h_bytes_per_second = 51e9;
  m.launch_seconds = 2.5e-6;
  calib::AttentionSample a;
  a.kernel = "ctxrun_fp32";
  a.head_dim = 128;
  a.q_heads = 16;
  a.kv_heads = 4;
  for (int64_t s : {1024, 4096}) {
    a.seq = s;
    a.pairs = s * (s + 1) / 2.0;
    a.fwd_seconds = a.fwd_flops() / 40e12;  // 40 TFLOP/s forward
    a.bwd_seconds = a.bwd_flops() / 20e12;  // 20 TFLOP/s backward
    m.attention.push_back(a);
  }
  a.head_dim = 64;  // kept in the raw samples, not in the curve
  m.attention.push_back(a);
  m.collectives.push_back({"all_reduce", 8, 1 << 30, (1 << 30) / 250e9});  // algbw 250 GB/s
  m.collectives.push_back({"all_reduce", 8, 1024, 20e-6});
  m.collectives.push_back({"p2p", 8, 1 << 30, (1 << 30) / 390e9});
  m.collective_launch_seconds = 20e-6;
  return m;
}

TEST(CalibrateProfile, MergedProfileLoadsWithTheCostModelsLoader) {
  json merged = calib::merge_into_profile(h200(), synthetic(), {"H200-measured", "2025-01-01", true});
  HardwareSpec h = hardware_from_json(merged, "merged");
  EXPECT_EQ(h.name, "H200-measured");
  // a renamed profile drops the base's aliases ("h200" would otherwise name two profiles)
  EXPECT_FALSE(h200()["aliases"].empty());
  EXPECT_TRUE(h.aliases.empty());
  const double peak = 989.4e12;
  // the gemm curve holds the bf16 samples' efficiencies, sorted by size
  ASSERT_EQ(h.kernels.gemm.points.size(), 3u);
  EXPECT_NEAR(h.kernels.gemm.points[1].first, 2.0 * 1024 * 1024 * 1024, 1);
  EXPECT_NEAR(h.kernels.gemm.points[1].second, 2.0 * 1024 * 1024 * 1024 / 10e-6 / peak, 1e-9);
  EXPECT_LT(h.kernels.gemm.points[0].first, h.kernels.gemm.points[1].first);
  EXPECT_NEAR(h.kernels.memory.at(512.0 * 1048576), 512.0 * 1048576 / 130e-6 / 4800e9, 1e-9);
  EXPECT_NEAR(h.kernels.launch_seconds, 2.5e-6, 1e-15);
  EXPECT_NEAR(h.pcie_bytes_per_second, 51e9, 1);
  EXPECT_EQ(h.usable_bytes, static_cast<int64_t>(143000.0 * 1048576));
}

TEST(CalibrateProfile, AttentionCurveUsesTheCostModelsFlopCount) {
  json merged = calib::merge_into_profile(h200(), synthetic(), {});
  HardwareSpec h = hardware_from_json(merged, "merged");
  const AttentionKernel* k = nullptr;
  for (auto& a : h.kernels.attention)
    if (a.name == "ctxrun_fp32") k = &a;
  ASSERT_NE(k, nullptr);
  EXPECT_NEAR(k->fwd.at(4096), 40e12 / 989.4e12, 1e-9);
  EXPECT_NEAR(k->bwd.at(1024), 20e12 / 989.4e12, 1e-9);
  EXPECT_EQ(merged["calibration"]["attention"].size(), 3u);  // the head_dim-64 sample is kept raw
}

TEST(CalibrateProfile, UnmeasuredFieldsKeepTheBase) {
  json base = h200();
  calib::Measurements m = synthetic();
  m.collectives.clear();
  json merged = calib::merge_into_profile(base, m, {});
  EXPECT_EQ(merged["default_fabric"], base["default_fabric"]);
  EXPECT_EQ(merged["peak_bf16_tflops"], base["peak_bf16_tflops"]);
  EXPECT_EQ(merged["kernels"]["attention"]["flash2"], base["kernels"]["attention"]["flash2"]);
  EXPECT_EQ(merged["kernels"]["attention"]["cudnn"], base["kernels"]["attention"]["cudnn"]);
  EXPECT_EQ(merged["collectives"], base["collectives"]);
  EXPECT_EQ(merged["name"], base["name"]);
  EXPECT_EQ(merged["aliases"], base["aliases"]);
}

TEST(CalibrateProfile, CollectivesBecomeBusBandwidthFractionsOfTheLink) {
  json merged = calib::merge_into_profile(h200(), synthetic(), {});
  HardwareSpec h = hardware_from_json(merged, "merged");
  // all_reduce over 8: busbw = algbw * 2*7/8 = 437.5 GB/s over a 450 GB/s link
  EXPECT_NEAR(h.collectives.all_reduce, 250e9 * 2 * 7 / 8 / 450e9, 1e-9);
  EXPECT_NEAR(h.collectives.p2p, 390e9 / 450e9, 1e-9);
  EXPECT_NEAR(h.collectives.all_gather, 0.803, 1e-12);  // not measured: the base's
  EXPECT_NEAR(h.collectives.launch_seconds, 20e-6, 1e-15);
  EXPECT_DOUBLE_EQ(calib::bus_factor("all_gather", 4), 0.75);
}

TEST(CalibrateProfile, EmptyMeasurementsChangeNoCurve) {
  json base = h200();
  json merged = calib::merge_into_profile(base, calib::Measurements{}, {});
  EXPECT_EQ(merged["kernels"]["gemm_gflop"], base["kernels"]["gemm_gflop"]);
  EXPECT_EQ(merged["kernels"]["memory_mib"], base["kernels"]["memory_mib"]);
  EXPECT_EQ(merged["pcie_gbps"], base["pcie_gbps"]);
  EXPECT_EQ(merged["usable_mib"], base["usable_mib"]);
  hardware_from_json(merged, "merged");
}

TEST(CalibrateProfile, BaseWithoutPeakIsABadInput) {
  json base = h200();
  base.erase("peak_bf16_tflops");
  EXPECT_THROW(calib::merge_into_profile(base, synthetic(), {}), InputError);
}

}  // namespace
