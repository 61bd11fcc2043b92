// Memory fidelity: for a matrix of plans, ctxrun's accounting allocator (every allocation tagged
// with the cost model's category) against the memory model's prediction for the same run, phase by
// phase and category by category, at precision=fp32 and precision=bf16. The prediction is the
// ctxrun-cpu runtime profile at the plan's precision, which ctxrun writes into its report beside
// the measurement. Tolerance: each category within 2% of its measured bytes (or 0.1% of the phase's
// total for categories that small). Set CTXPLAN_FIDELITY_MD=file to append the table rows that
// docs/VALIDATION.md shows (scripts/memory_fidelity.sh).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "executor/tests/ctxrun_cli.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Case = ctx::exec::testing::PlanCase;

// Each row exercises a different term of the model; the attention-heavy rows (cp=4 at 1024
// tokens with a tiled MLP) put the peak in the attention backward, the others in the MLP backward.
const Case kCases[] = {
    {1, "tiny", 512, "tp=1"},
    {1, "tiny", 512, "recompute=selective"},
    {1, "tiny", 512, "recompute=full"},
    {1, "tiny", 512, "recompute=full,ckpt_offload=1"},
    {1, "tiny", 512, "tiled_mlp=4,tiled_loss=64"},
    {2, "tiny", 512, "tp=2"},
    {2, "tiny", 512, "tp=2,sp=0"},
    {2, "tiny", 512, "cp=2,cp_kind=ring"},
    {4, "tiny", 1024, "cp=4,cp_kind=zigzag,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_kind=allgather,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_kind=ulysses,tiled_mlp=8"},
    {4, "tiny-nope", 512, "cp=4,cp_kind=ulysses"},
    {4, "tiny", 1024, "cp=4,cp_kind=usp,ulysses=2,tiled_mlp=8"},
    {2, "tiny", 512, "dp=2,zero=1,opt_offload=1"},
    {2, "tiny", 512, "dp=2,zero=2"},
    {2, "tiny", 512, "dp=2,zero=3,mbs=2,ga=2"},
    {4, "tiny", 512, "tp=2,cp=2,cp_kind=zigzag,recompute=full"},
    {8, "tiny", 512, "dp=2,tp=2,cp=2,zero=3,recompute=selective"},
    // issue 21: HSDP, the model states sharded over 2 of the 4 dp x cp ranks
    {4, "tiny", 512, "dp=4,zero=3,zero_shard=2"},
    {4, "tiny", 512, "dp=2,cp=2,cp_kind=ring,zero=1,zero_shard=2"},
    // issue 20: every CP exchange x layout over packed documents of very different lengths (928 and
    // 96 tokens, multiples of 2*cp as headtail-doc needs), attention-heavy as the cp=4 rows above
    {4, "tiny", 1024, "cp=4,cp_comm=p2p,cp_layout=contiguous,mask=doc:928,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_comm=p2p,cp_layout=headtail,mask=doc:928,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_comm=p2p,cp_layout=headtail-doc,mask=doc:928,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_comm=allgather,cp_layout=contiguous,mask=doc:928,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_comm=allgather,cp_layout=headtail,mask=doc:928,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_comm=allgather,cp_layout=headtail-doc,mask=doc:928,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_comm=a2a,cp_layout=contiguous,mask=doc:928,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_comm=a2a,cp_layout=headtail,mask=doc:928,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_comm=a2a,cp_layout=headtail-doc,mask=doc:928,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_comm=a2a+p2p,ulysses=2,cp_layout=contiguous,mask=doc:928,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_comm=a2a+p2p,ulysses=2,cp_layout=headtail,mask=doc:928,tiled_mlp=8"},
    {4, "tiny", 1024, "cp=4,cp_comm=a2a+p2p,ulysses=2,cp_layout=headtail-doc,mask=doc:928,tiled_mlp=8"},
    // issue 21: optimizer precision, no master copy and bf16 Adam moments, unsharded and under ZeRO-1/3
    {1, "tiny", 512, "moments=bf16,master=none"},
    {2, "tiny", 512, "dp=2,zero=1,moments=bf16,master=none"},
    {2, "tiny", 512, "dp=2,zero=3,moments=bf16,master=none"},
};

double sum(const json& cats) {
  double t = 0;
  for (auto& [k, v] : cats.items()) t += v.get<double>();
  return t;
}

class MemoryFidelity : public ::testing::TestWithParam<std::tuple<Case, const char*>> {};

TEST_P(MemoryFidelity, MeasuredPeaksEqualTheMemoryModel) {
  Case c = std::get<0>(GetParam());
  const std::string plan = std::string(c.plan) + ",precision=" + std::get<1>(GetParam());
  c.plan = plan.c_str();
  fs::path report = fs::temp_directory_path() / ("ctxrun_fidelity_" + std::to_string(::getpid()) + ".json");
  const std::string cmd = ctx::exec::testing::ctxrun(c.ranks, std::string("--model ") + c.model + " --seq " +
                                                                   std::to_string(c.seq) + " --steps 2 --plan " + c.plan +
                                                                   " --report " + report.string());
  const auto r = ctx::exec::testing::sh(cmd);
  ASSERT_EQ(r.code, 0) << cmd << "\n" << r.out;
  std::ifstream f(report);
  json j = json::parse(f);
  fs::remove(report);
  const json& meas = j.at("memory").at("phases");
  const json& pred = j.at("prediction").at("memory").at("phases");
  std::ostringstream row;
  row << "| " << c.ranks << " | " << c.model << " | " << c.seq << " | `" << c.plan << "` |";
  double worst = 0;
  for (const char* phase : {"forward", "loss", "backward", "optimizer"}) {
    const json& m = meas.at(phase).at("by_category");
    const json& p = pred.at(phase).at("by_category");
    const double mt = sum(m), pt = sum(p);
    for (auto& [cat, v] : p.items()) {
      const double pv = v.get<double>(), mv = m.value(cat, 0.0);
      const double tol = std::max(0.02 * mv, 0.001 * mt);
      EXPECT_NEAR(pv, mv, tol) << c << ": " << phase << " " << cat << " predicted " << pv << " B, measured " << mv << " B";
    }
    for (auto& [cat, v] : m.items()) {
      if (!p.contains(cat)) {
        EXPECT_EQ(v.get<double>(), 0.0) << c << ": " << phase << " " << cat << " not predicted";
      }
    }
    const double err = mt > 0 ? (pt - mt) / mt : 0.0;
    worst = std::max(worst, std::fabs(err));
    char cell[96];
    std::snprintf(cell, sizeof(cell), " %.1f / %.1f (%+.2f%%) |", mt / 1024.0, pt / 1024.0, 100.0 * err);
    row << cell;
  }
  const std::string peak_phase = j.at("memory").at("peak_phase");
  row << " " << peak_phase << " / " << j.at("prediction").at("memory").value("peak_phase", std::string("?")) << " |";
  std::printf("%s\n", row.str().c_str());
  if (const char* md = std::getenv("CTXPLAN_FIDELITY_MD")) std::ofstream(md, std::ios::app) << row.str() << "\n";
}

INSTANTIATE_TEST_SUITE_P(Matrix, MemoryFidelity, ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values("fp32", "bf16")),
                         [](const ::testing::TestParamInfo<std::tuple<Case, const char*>>& i) {
                           return "Case" + std::to_string(i.index / 2) + "_" + std::get<1>(i.param);
                         });

}  // namespace
