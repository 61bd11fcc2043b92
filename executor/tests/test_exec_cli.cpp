// ctxrun end to end: training makes progress, resume is bit-exact, bad input is refused with the
// file/field named and the right exit code, divergence names the step and layer, and a checkpoint
// already on disk is never damaged.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "executor/data.hpp"
#include "costmodel/exit_codes.hpp"
#include "executor/tests/ctxrun_cli.hpp"

namespace fs = std::filesystem;

namespace {

using ctx::exec::testing::ctxrun;
using ctx::exec::testing::Result;
using ctx::exec::testing::sh;

fs::path scratch(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("ctxrun_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST(ExecCli, TrainingOnBuiltInDataLossFallsWellBelowStart) {
  fs::path d = scratch("train");
  Result r = sh(ctxrun(2, "--model tiny --seq 128 --steps 60 --log-every 20 --plan cp=2,cp_kind=zigzag --report " +
                              (d / "run.json").string()));
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(slurp(d / "run.json"));
  auto losses = j["losses"].get<std::vector<double>>();
  ASSERT_EQ(losses.size(), 60u);
  // ln(256) = 5.55 at the start (uniform over the vocabulary); the bigram filler alone allows far less
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.1);
  double tail = 0;
  for (size_t i = losses.size() - 5; i < losses.size(); ++i) tail += losses[i] / 5;
  EXPECT_LT(tail, 0.6 * losses.front()) << r.out;
  EXPECT_EQ(j["schema"], "ctxplan.measurement/1");
  EXPECT_GT(j["memory"]["by_category"]["weights"].get<double>(), 0);
  EXPECT_EQ(j["ranks"].size(), 2u);
}

TEST(ExecCli, ResumeContinuesBitExactly) {
  fs::path a = scratch("resume_a"), b = scratch("resume_b");
  const std::string common = "--model tiny --seq 64 --plan cp=2,cp_kind=ring,zero=1 --lr 1e-2 --warmup 2 --schedule-steps 6 ";
  Result full = sh(ctxrun(2, common + "--steps 6 --ckpt-dir " + a.string() + " --report " + (a / "r.json").string()));
  ASSERT_EQ(full.code, 0) << full.out;
  Result half = sh(ctxrun(2, common + "--steps 3 --ckpt-dir " + b.string()));
  ASSERT_EQ(half.code, 0) << half.out;
  Result rest = sh(ctxrun(2, common + "--steps 6 --resume --ckpt-dir " + b.string() + " --report " + (b / "r.json").string()));
  ASSERT_EQ(rest.code, 0) << rest.out;
  EXPECT_NE(rest.out.find("resumed"), std::string::npos);
  std::string wa = slurp(a / "step-000006" / "model.safetensors"), wb = slurp(b / "step-000006" / "model.safetensors");
  ASSERT_FALSE(wa.empty());
  EXPECT_TRUE(wa == wb) << "weights after 6 steps differ between a straight run and 3 + resume + 3";
  EXPECT_TRUE(slurp(a / "step-000006" / "optimizer.safetensors") == slurp(b / "step-000006" / "optimizer.safetensors"));
  auto la = nlohmann::json::parse(slurp(a / "r.json"))["losses"].get<std::vector<double>>();
  auto lb = nlohmann::json::parse(slurp(b / "r.json"))["losses"].get<std::vector<double>>();
  ASSERT_EQ(lb.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(la[3 + i], lb[i]);  // bit for bit
  // the checkpoint carries Hugging Face Llama names
  std::string w = slurp(a / "step-000006" / "model.safetensors");
  EXPECT_NE(w.find("model.layers.1.self_attn.q_proj.weight"), std::string::npos);
  EXPECT_NE(w.find("lm_head.weight"), std::string::npos);
}

TEST(ExecCli, CorruptOrTruncatedTokenFileIsBadInput) {
  fs::path d = scratch("tokens");
  std::vector<uint16_t> toks(2000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>(i % 200);
  ctx::exec::write_token_file((d / "ok.bin").string(), toks);
  Result ok = sh(ctxrun(1, "--model tiny --seq 64 --steps 2 --data " + (d / "ok.bin").string()));
  EXPECT_EQ(ok.code, 0) << ok.out;
  std::string bytes = slurp(d / "ok.bin");
  { std::ofstream f(d / "trunc.bin", std::ios::binary); f << bytes.substr(0, bytes.size() - 100); }
  Result t = sh(ctxrun(1, "--model tiny --seq 64 --steps 2 --data " + (d / "trunc.bin").string()));
  EXPECT_EQ(t.code, 2) << t.out;
  EXPECT_NE(t.out.find("trunc.bin"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("truncated"), std::string::npos) << t.out;
  std::string bad = bytes;
  bad[0] = 'x';
  { std::ofstream f(d / "magic.bin", std::ios::binary); f << bad; }
  Result m = sh(ctxrun(1, "--model tiny --seq 64 --steps 2 --data " + (d / "magic.bin").string()));
  EXPECT_EQ(m.code, 2) << m.out;
  EXPECT_NE(m.out.find("magic"), std::string::npos) << m.out;
  toks[7] = 300;  // outside tiny's vocabulary of 256
  ctx::exec::write_token_file((d / "vocab.bin").string(), toks);
  Result v = sh(ctxrun(1, "--model tiny --seq 64 --steps 2 --data " + (d / "vocab.bin").string()));
  EXPECT_EQ(v.code, 2) << v.out;
  EXPECT_NE(v.out.find("vocabulary"), std::string::npos) << v.out;
}

TEST(ExecCli, PlanWorldMismatchIsRefusedBeforeAllocating) {
  Result r = sh(ctxrun(2, "--model tiny --seq 64 --steps 1 --plan tp=2,cp=2"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--plan"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 GPUs"), std::string::npos) << r.out;
}

TEST(ExecCli, PlanTheMemoryModelRejectsIsRefusedWithExitCode3) {
  Result r = sh(ctxrun(1, "--model Llama-3.1-70B --seq 1m --steps 1 --plan recompute=none"));
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("refusing before allocating"), std::string::npos) << r.out;
}

TEST(ExecCli, CheckpointFromAnotherModelIsBadInputAndLeftIntact) {
  fs::path d = scratch("other_model");
  Result a = sh(ctxrun(1, "--model tiny --seq 64 --steps 2 --ckpt-dir " + d.string()));
  ASSERT_EQ(a.code, 0) << a.out;
  std::string before = slurp(d / "step-000002" / "model.safetensors");
  Result b = sh(ctxrun(1, "--model tiny-nope --seq 64 --steps 4 --resume --ckpt-dir " + d.string()));
  EXPECT_EQ(b.code, 2) << b.out;
  EXPECT_NE(b.out.find("model.safetensors"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("tiny-nope"), std::string::npos) << b.out;
  EXPECT_TRUE(before == slurp(d / "step-000002" / "model.safetensors"));
}

TEST(ExecCli, NanLossStopsNamingStepAndLayerWithoutTouchingCheckpoints) {
  fs::path d = scratch("nan");
  Result a = sh(ctxrun(2, "--model tiny --seq 64 --steps 2 --plan tp=2 --ckpt-dir " + d.string()));
  ASSERT_EQ(a.code, 0) << a.out;
  std::string before = slurp(d / "step-000002" / "model.safetensors");
  Result b = sh(ctxrun(2, "--model tiny --seq 64 --steps 6 --plan tp=2 --resume --save-every 1 --debug-nan 4:1 --ckpt-dir " +
                              d.string()));
  EXPECT_EQ(b.code, ctx::kExitDiverged) << b.out;
  EXPECT_NE(b.out.find("step 4"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("layer 1"), std::string::npos) << b.out;
  EXPECT_TRUE(before == slurp(d / "step-000002" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(d / "step-000003"));   // the last good step was saved
  EXPECT_FALSE(fs::exists(d / "step-000004"));  // the diverged one was not
  EXPECT_EQ(slurp(d / "latest"), "step-000003\n");
}

// Sorted packing (GLM-4's balance of attention work, sum of squared document lengths, across
// data-parallel ranks): every sequence of the step goes to exactly one rank, each rank gets its
// share, and the heaviest rank carries less work than with in-order packing.
TEST(ExecData, SortedPackingBalancesAttentionWorkAcrossDataParallelRanks) {
  using namespace ctx::exec;
  DataOptions d;
  d.seq = 512;
  d.vocab = 256;
  d.doc_mask = true;
  d.doc_min = 16;
  d.doc_max = 400;
  auto data = make_synthetic(d);
  const int64_t dp = 4, per_rank = 4, steps = 25;
  double max_sorted = 0, max_plain = 0, mean = 0;
  int sorted_not_worse = 0;
  for (int64_t step = 0; step < steps; ++step) {
    auto loads = [&](bool sorted) {
      auto a = step_assignment(*data, step, dp, per_rank, sorted);
      std::vector<int64_t> seen;
      std::vector<double> load;
      for (auto& r : a) {
        EXPECT_EQ(static_cast<int64_t>(r.size()), per_rank);
        double w = 0;
        for (int64_t i : r) { seen.push_back(i); w += attention_work(data->sequence(i)); }
        load.push_back(w);
      }
      std::sort(seen.begin(), seen.end());
      for (int64_t k = 0; k < dp * per_rank; ++k) EXPECT_EQ(seen[k], step * dp * per_rank + k);
      return load;
    };
    auto s = loads(true), p = loads(false);
    const double ms = *std::max_element(s.begin(), s.end()), mp = *std::max_element(p.begin(), p.end());
    max_sorted += ms;
    max_plain += mp;
    for (double w : s) mean += w / dp;
    sorted_not_worse += ms <= mp;
  }
  mean /= steps;
  max_sorted /= steps;
  max_plain /= steps;
  std::printf("heaviest rank / mean rank attention work: sorted %.3f, in order %.3f\n", max_sorted / mean,
              max_plain / mean);
  EXPECT_GE(sorted_not_worse, steps * 4 / 5);
  EXPECT_LT(max_sorted / mean, 1.0 + 0.5 * (max_plain / mean - 1.0));  // at least half the imbalance removed
}

// A rank that fails while the others wait for it in a collective ends the whole job with its
// message, instead of leaving them blocked (the test's own timeout would catch a hang); the
// checkpoint already on disk is untouched.
TEST(ExecCli, InternalErrorOnOneRankAbortsEveryRankWithoutDamagingCheckpoints) {
  fs::path d = scratch("fail");
  Result a = sh(ctxrun(2, "--model tiny --seq 64 --steps 2 --plan cp=2 --ckpt-dir " + d.string()));
  ASSERT_EQ(a.code, 0) << a.out;
  std::string before = slurp(d / "step-000002" / "model.safetensors");
  Result b = sh("timeout 60 " + ctxrun(2, "--model tiny --seq 64 --steps 5 --plan cp=2 --resume --debug-fail 1:4 --ckpt-dir " +
                                              d.string()));
  EXPECT_NE(b.code, 0) << b.out;
  EXPECT_NE(b.code, 124) << "ranks hung after one failed:\n" << b.out;
  EXPECT_NE(b.out.find("internal error on rank 1"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("injected failure"), std::string::npos) << b.out;
  EXPECT_TRUE(before == slurp(d / "step-000002" / "model.safetensors"));
  EXPECT_EQ(slurp(d / "latest"), "step-000002\n");
}

// A checkpoint folder is a Hugging Face Llama checkpoint (config.json + model.safetensors with HF
// tensor names) and a valid --init-from source: without --model the run takes the architecture
// from config.json, the first loss is the same under any plan and differs from a fresh start,
// and weights of another architecture are refused naming the file.
TEST(ExecCli, InitFromHuggingFaceFolderLoadsConfigAndWeightsUnderAnyPlan) {
  fs::path d = scratch("initfrom");
  Result a = sh(ctxrun(1, "--model tiny --seq 64 --steps 3 --ckpt-dir " + d.string()));
  ASSERT_EQ(a.code, 0) << a.out;
  fs::path hf = d / "step-000003";
  ASSERT_TRUE(fs::exists(hf / "config.json"));
  nlohmann::json cfg = nlohmann::json::parse(slurp(hf / "config.json"));
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["num_hidden_layers"], 2);
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_NE(slurp(hf / "model.safetensors").find("model.layers.1.self_attn.q_proj.weight"), std::string::npos);
  auto first_loss = [&](int ranks, const std::string& args) {
    fs::path rep = d / ("r" + std::to_string(ranks) + ".json");
    Result r = sh(ctxrun(ranks, "--seq 64 --steps 1 --report " + rep.string() + " " + args));
    EXPECT_EQ(r.code, 0) << r.out;
    if (r.code != 0) return -1.0;
    return nlohmann::json::parse(slurp(rep))["losses"][0].get<double>();
  };
  // fp32, so that tp=1 and tp=2 differ only in the order of float32 sums
  double one = first_loss(1, "--plan precision=fp32 --init-from " + hf.string());
  double tp2 = first_loss(2, "--plan tp=2,precision=fp32 --init-from " + hf.string());
  double fresh = first_loss(1, "--model tiny --plan precision=fp32");
  EXPECT_NEAR(one, tp2, 1e-5 * std::fabs(one));
  EXPECT_GT(std::fabs(one - fresh), 1e-3) << "the loaded weights made no difference";
  Result bad = sh(ctxrun(1, "--model tiny-nope --seq 64 --steps 1 --init-from " + hf.string()));
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find(hf.string()), std::string::npos) << bad.out;
}

// --backend cuda where it cannot run (no device here, or a build without CUDA) is bad input that
// names the flag, before anything is allocated.
TEST(ExecCli, CudaBackendWithoutADeviceIsRefusedNamingTheFlag) {
  Result r = sh(ctxrun(1, "--model tiny --seq 64 --steps 1 --backend cuda"));
  if (r.out.find("no CUDA device") == std::string::npos && r.out.find("built without CUDA") == std::string::npos &&
      r.code == 0)
    GTEST_SKIP() << "a CUDA device is present: the GPU suite (ctest -L gpu) covers this backend";
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--backend"), std::string::npos) << r.out;
  Result bad = sh(ctxrun(1, "--model tiny --seq 64 --steps 1 --backend tpu"));
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--backend"), std::string::npos) << bad.out;
}
