#include "executor/cuda/calibrate_profile.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <sstream>

#include "costmodel/errors.hpp"

namespace ctx::exec::calib {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
// The loader accepts efficiencies in (0, 1.2]; a measurement outside is clamped, not dropped.
constexpr double kMinEfficiency = 1e-4, kMaxEfficiency = 1.2;

// Points (size, efficiency) sorted by size, one per size (the best measurement), clamped.
json curve(std::vector<std::pair<double, double>> pts, const std::string& source) {
  std::sort(pts.begin(), pts.end());
  json points = json::array();
  for (size_t i = 0; i < pts.size(); ++i) {
    const double x = pts[i].first;
    double y = pts[i].second;
    while (i + 1 < pts.size() && pts[i + 1].first == x) y = std::max(y, pts[++i].second);
    if (!(x > 0) || !std::isfinite(x) || !std::isfinite(y)) continue;
    points.push_back({x, std::clamp(y, kMinEfficiency, kMaxEfficiency)});
  }
  return {{"source", source}, {"points", points}};
}

std::string fmt(double v, int prec = 3) {
  std::ostringstream o;
  o.precision(prec);
  o << v;
  return o.str();
}

}  // namespace

double CollectiveSample::busbw_bytes_per_second() const {
  return seconds > 0 ? bytes / seconds * bus_factor(op, ranks) : 0.0;
}

double bus_factor(const std::string& op, int ranks) {
  const double n = std::max(ranks, 1);
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return (n - 1) / n;
  return 1.0;  // p2p
}

json merge_into_profile(const json& base, const Measurements& m, const MergeOptions& o) {
  JsonReader r(base, "--base");
  const double peak = r.number("peak_bf16_tflops") * 1e12;      // efficiencies are fractions of the bf16 peak
  const double hbm = r.number("hbm_gbps") * 1e9;                // memory curve: fraction of peak bandwidth
  const double link = r.object("default_fabric").number("nvlink_gbps") * 1e9;  // busbw over the link rate
  if (!(peak > 0)) r.fail("peak_bf16_tflops", "must be positive to turn GEMM times into efficiencies");
  if (!(hbm > 0)) r.fail("hbm_gbps", "must be positive to turn copy times into efficiencies");

  json out = base;
  const std::string who = m.tool + " on " + m.device_name + " (sm_" + std::to_string(m.sm) + ", " + m.driver + ")" +
                          (o.date.empty() ? "" : ", " + o.date);
  if (!o.name.empty() && o.name != base.value("name", std::string())) {
    out["name"] = o.name;
    // the base's aliases name the base: kept, `--cluster 1x8xh200` would find two profiles
    out["aliases"] = json::array();
  }
  out["source"] = base.value("source", std::string()) + "; kernels re-measured by " + who;
  json& k = out["kernels"];
  k["source"] = "measured by " + who + "; efficiencies are fractions of peak_bf16_tflops / hbm_gbps of this profile";

  // GEMM: bf16 is what the cost model prices (fp8 plans scale the same curve); fp32 kept beside it.
  std::vector<std::pair<double, double>> bf16, fp32;
  for (const GemmSample& g : m.gemm) {
    if (!(g.seconds > 0)) continue;
    const double eff = g.flops() / g.seconds / peak;
    (g.dtype == "bf16" ? bf16 : fp32).emplace_back(g.flops() / 1e9, eff);
  }
  if (!bf16.empty())
    k["gemm_gflop"] = curve(bf16, "cuBLASLt bf16 (fp32 accumulate), C = A B^T, squares 256..16384 and Llama-8B "
                                  "projections at 4K tokens; efficiency vs peak_bf16_tflops; " + who);
  if (!fp32.empty())
    k["gemm_fp32_gflop"] = curve(fp32, "cuBLASLt fp32 (exact fp32 compute, as ctxrun's float32 backend runs today); "
                                       "efficiency vs peak_bf16_tflops; prices precision=fp32 GEMMs; " + who);

  std::vector<std::pair<double, double>> mem;
  for (const CopySample& c : m.device_copy)
    if (c.seconds > 0) mem.emplace_back(c.bytes_moved / kMiB, c.bytes_moved / c.seconds / hbm);
  if (!mem.empty())
    k["memory_mib"] = curve(mem, "cudaMemcpyAsync device to device, bytes read + written (MiB); efficiency vs "
                                 "hbm_gbps; " + who);
  if (m.launch_seconds > 0) k["launch_us"] = m.launch_seconds * 1e6;

  // Attention: one curve per kernel over tokens per call, from the head_dim-128 samples (the
  // common Llama head size); every sample is kept under "calibration".
  std::map<std::string, std::pair<std::vector<std::pair<double, double>>, std::vector<std::pair<double, double>>>> att;
  for (const AttentionSample& a : m.attention) {
    if (a.head_dim != 128 || !(a.fwd_seconds > 0) || !(a.bwd_seconds > 0)) continue;
    att[a.kernel].first.emplace_back(static_cast<double>(a.seq), a.fwd_flops() / a.fwd_seconds / peak);
    att[a.kernel].second.emplace_back(static_cast<double>(a.seq), a.bwd_flops() / a.bwd_seconds / peak);
  }
  for (auto& [name, fb] : att) {
    const std::string src = name + ", causal, head_dim 128, 16 query / 4 KV heads; FLOPs counted as the cost model "
                                   "does (4 d per visible pair and head forward, 2.5x backward); efficiency vs "
                                   "peak_bf16_tflops; " + who;
    k["attention"][name] = {{"fwd_tokens", curve(fb.first, src)}, {"bwd_tokens", curve(fb.second, src)}};
  }

  if (m.h2d_bytes_per_second > 0 && m.d2h_bytes_per_second > 0)
    out["pcie_gbps"] = std::min(m.h2d_bytes_per_second, m.d2h_bytes_per_second) / 1e9;  // one direction, the slower
  if (o.set_memory && m.total_bytes > 0 && m.free_bytes > 0) {
    out["hbm_mib"] = std::floor(m.total_bytes / kMiB);
    out["usable_mib"] = std::floor(std::min(m.free_bytes, m.total_bytes) / kMiB);  // free once the context is up
  }

  // Collectives: the largest message's bus bandwidth over the NVLink rate (intra-node only).
  if (!m.collectives.empty() && link > 0) {
    json& c = out["collectives"];
    std::map<std::string, std::pair<double, double>> largest;  // op -> (bytes, busbw)
    int ranks = 0;
    for (const CollectiveSample& s : m.collectives) {
      ranks = std::max(ranks, s.ranks);
      auto& e = largest[s.op];
      if (s.bytes >= e.first) e = {s.bytes, s.busbw_bytes_per_second()};
    }
    for (auto& [op, e] : largest)
      if (e.second > 0) c["intra_busbw_fraction"][op] = std::clamp(e.second / link, kMinEfficiency, 2.0);
    if (m.collective_launch_seconds > 0) c["launch_us"] = m.collective_launch_seconds * 1e6;
    c["source"] = "NCCL in one process over " + std::to_string(ranks) + " GPUs (nccl-tests conventions: busbw of the "
                  "largest message, " + fmt(largest.begin()->second.first / kMiB, 4) + " MiB and up, over nvlink_gbps); "
                  "inter_efficiency kept from the base; " + who;
  }

  // Raw samples: what the curves were computed from.
  json cal;
  cal["tool"] = m.tool;
  cal["device"] = m.device_name;
  cal["sm"] = m.sm;
  cal["driver"] = m.driver;
  if (!m.cudnn_version.empty()) cal["cudnn"] = m.cudnn_version;
  if (!o.date.empty()) cal["date"] = o.date;
  cal["gemm"] = json::array();
  for (const GemmSample& g : m.gemm)
    cal["gemm"].push_back({{"dtype", g.dtype}, {"m", g.m}, {"n", g.n}, {"k", g.k}, {"seconds", g.seconds},
                           {"tflops", g.seconds > 0 ? g.flops() / g.seconds / 1e12 : 0.0}});
  cal["device_copy"] = json::array();
  for (const CopySample& c : m.device_copy)
    cal["device_copy"].push_back({{"bytes_moved", c.bytes_moved}, {"seconds", c.seconds},
                                  {"gbps", c.seconds > 0 ? c.bytes_moved / c.seconds / 1e9 : 0.0}});
  cal["h2d_gbps"] = m.h2d_bytes_per_second / 1e9;
  cal["d2h_gbps"] = m.d2h_bytes_per_second / 1e9;
  cal["launch_us"] = m.launch_seconds * 1e6;
  cal["attention"] = json::array();
  for (const AttentionSample& a : m.attention)
    cal["attention"].push_back({{"kernel", a.kernel}, {"seq", a.seq}, {"head_dim", a.head_dim}, {"q_heads", a.q_heads},
                                {"kv_heads", a.kv_heads}, {"causal", a.causal}, {"fwd_seconds", a.fwd_seconds},
                                {"bwd_seconds", a.bwd_seconds},
                                {"fwd_tflops", a.fwd_seconds > 0 ? a.fwd_flops() / a.fwd_seconds / 1e12 : 0.0},
                                {"bwd_tflops", a.bwd_seconds > 0 ? a.bwd_flops() / a.bwd_seconds / 1e12 : 0.0}});
  cal["collectives"] = json::array();
  for (const CollectiveSample& s : m.collectives)
    cal["collectives"].push_back({{"op", s.op}, {"ranks", s.ranks}, {"bytes", s.bytes}, {"seconds", s.seconds},
                                  {"algbw_gbps", s.seconds > 0 ? s.bytes / s.seconds / 1e9 : 0.0},
                                  {"busbw_gbps", s.busbw_bytes_per_second() / 1e9}});
  out["calibration"] = cal;
  return out;
}

}  // namespace ctx::exec::calib
