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

fs::path scratch(const std::string& name) { return ctx::exec::testing::scratch("ctxrun_test", name); }
using ctx::exec::testing::slurp;

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
  for (const char* f : {"rank-00000.safetensors", "rank-00001.safetensors"}) {
    std::string wa = slurp(a / "step-000006" / f), wb = slurp(b / "step-000006" / f);
    ASSERT_FALSE(wa.empty()) << f;
    EXPECT_TRUE(wa == wb) << f << ": weights and Adam state after 6 steps differ between a straight run and 3 + resume + 3";
  }
  auto la = nlohmann::json::parse(slurp(a / "r.json"))["losses"].get<std::vector<double>>();
  auto lb = nlohmann::json::parse(slurp(b / "r.json"))["losses"].get<std::vector<double>>();
  ASSERT_EQ(lb.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(la[3 + i], lb[i]);  // bit for bit
}

// Sharded checkpoints under dp=2,cp=2,zero=3: one file per rank holding that rank's quarter
// (master weights, Adam m and v; no rank holds the whole model), resume is bit-exact, a
// different plan is refused naming the index file, and --export-hf writes a Hugging Face folder
// that another plan starts from with the same first loss.
// HSDP (issue 21): replicas hold the same shard; a resumed run continues bit for bit, and the
// checkpoint is refused under the same degrees sharded over all dp ranks (another sharding).
TEST(ExecCli, HsdpCheckpointResumesBitExactlyAndRefusesFullSharding) {
  fs::path a = scratch("hsdp_a"), b = scratch("hsdp_b");
  const std::string common = "--model tiny --seq 64 --plan dp=4,zero=3,zero_shard=2,precision=fp32 --lr 1e-2 --warmup 2 --schedule-steps 4 ";
  Result full = sh(ctxrun(4, common + "--steps 4 --ckpt-dir " + a.string() + " --report " + (a / "r.json").string()));
  ASSERT_EQ(full.code, 0) << full.out;
  Result half = sh(ctxrun(4, common + "--steps 2 --ckpt-dir " + b.string()));
  ASSERT_EQ(half.code, 0) << half.out;
  Result rest = sh(ctxrun(4, common + "--steps 4 --resume --ckpt-dir " + b.string() + " --report " + (b / "r.json").string()));
  ASSERT_EQ(rest.code, 0) << rest.out;
  auto la = nlohmann::json::parse(slurp(a / "r.json"))["losses"].get<std::vector<double>>();
  auto lb = nlohmann::json::parse(slurp(b / "r.json"))["losses"].get<std::vector<double>>();
  ASSERT_EQ(la.size(), 4u);
  ASSERT_EQ(lb.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(la[2 + i], lb[i]);  // bit for bit
  Result flat = sh(ctxrun(4, "--model tiny --seq 64 --plan dp=4,zero=3,precision=fp32 --steps 6 --resume --ckpt-dir " + b.string()));
  EXPECT_EQ(flat.code, 2) << flat.out;
  EXPECT_NE(flat.out.find("zero_shard=2"), std::string::npos) << flat.out;
}

TEST(ExecCli, ShardedCheckpointPerRankResumesBitExactlyAndRefusesAnotherPlan) {
  fs::path a = scratch("shard_a"), b = scratch("shard_b"), hf = scratch("shard_hf");
  const std::string common =
      "--model tiny --seq 64 --plan dp=2,cp=2,zero=3,precision=fp32 --lr 1e-2 --warmup 2 --schedule-steps 6 ";
  Result full = sh(ctxrun(4, common + "--steps 6 --ckpt-dir " + a.string() + " --report " + (a / "r.json").string() +
                                 " --export-hf " + hf.string()));
  ASSERT_EQ(full.code, 0) << full.out;
  Result half = sh(ctxrun(4, common + "--steps 3 --ckpt-dir " + b.string()));
  ASSERT_EQ(half.code, 0) << half.out;
  Result rest = sh(ctxrun(4, common + "--steps 6 --resume --ckpt-dir " + b.string() + " --report " + (b / "r.json").string()));
  ASSERT_EQ(rest.code, 0) << rest.out;
  EXPECT_NE(rest.out.find("resumed"), std::string::npos);
  // one shard file per rank, each about a quarter of (weights + m + v); the full weights are the export
  const auto model_bytes = static_cast<double>(fs::file_size(hf / "model.safetensors"));
  ASSERT_TRUE(fs::exists(a / "step-000006" / "trainer.json"));
  EXPECT_FALSE(fs::exists(a / "step-000006" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(a / "step-000006" / "rank-00004.safetensors"));
  for (int r = 0; r < 4; ++r) {
    char f[40];
    std::snprintf(f, sizeof(f), "rank-%05d.safetensors", r);
    ASSERT_TRUE(fs::exists(a / "step-000006" / f)) << f;
    const auto bytes = static_cast<double>(fs::file_size(a / "step-000006" / f));
    EXPECT_NEAR(bytes / (3 * model_bytes / 4), 1.0, 0.05) << f << " is not a quarter of weights + m + v";
    EXPECT_LT(bytes, model_bytes) << f << " holds as much as the full model";
    EXPECT_TRUE(slurp(a / "step-000006" / f) == slurp(b / "step-000006" / f)) << f << " differs after resume";
  }
  auto la = nlohmann::json::parse(slurp(a / "r.json"))["losses"].get<std::vector<double>>();
  auto lb = nlohmann::json::parse(slurp(b / "r.json"))["losses"].get<std::vector<double>>();
  ASSERT_EQ(la.size(), 6u);
  ASSERT_EQ(lb.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(la[3 + i], lb[i]);  // bit for bit
  // another plan on the same 4 ranks: refused, naming the index file and the way out
  const std::string before = slurp(b / "step-000006" / "rank-00000.safetensors");
  Result other = sh(ctxrun(4, "--model tiny --seq 64 --plan tp=2,dp=2,zero=1,precision=fp32 --steps 8 --resume --ckpt-dir " +
                                  b.string()));
  EXPECT_EQ(other.code, 2) << other.out;
  EXPECT_NE(other.out.find((b / "step-000006" / "trainer.json").string()), std::string::npos) << other.out;
  EXPECT_NE(other.out.find("tp=1,cp=2,dp=2,zero=3"), std::string::npos) << other.out;
  EXPECT_NE(other.out.find("resharding"), std::string::npos) << other.out;
  EXPECT_NE(other.out.find("--export-hf"), std::string::npos) << other.out;
  // another world size too
  Result fewer = sh(ctxrun(2, "--model tiny --seq 64 --plan cp=2,zero=3,precision=fp32 --steps 8 --resume --ckpt-dir " +
                                  b.string()));
  EXPECT_EQ(fewer.code, 2) << fewer.out;
  EXPECT_NE(fewer.out.find("trainer.json"), std::string::npos) << fewer.out;
  EXPECT_TRUE(before == slurp(b / "step-000006" / "rank-00000.safetensors"));
  EXPECT_EQ(slurp(b / "latest"), "step-000006\n");
  // a damaged shard file is refused naming it
  fs::resize_file(b / "step-000006" / "rank-00002.safetensors", 1000);
  Result damaged = sh(ctxrun(4, common + "--steps 8 --resume --ckpt-dir " + b.string()));
  EXPECT_EQ(damaged.code, 2) << damaged.out;
  EXPECT_NE(damaged.out.find("rank-00002.safetensors"), std::string::npos) << damaged.out;
  // the consolidated export: Hugging Face names, and any plan starts from it with the same first loss
  std::string w = slurp(hf / "model.safetensors");
  EXPECT_NE(w.find("model.layers.1.self_attn.q_proj.weight"), std::string::npos);
  EXPECT_NE(w.find("lm_head.weight"), std::string::npos);
  ASSERT_TRUE(fs::exists(hf / "config.json"));
  auto first_loss = [&](int ranks, const std::string& plan) {
    fs::path rep = hf / (std::string("r") + std::to_string(ranks) + ".json");
    Result r = sh(ctxrun(ranks, "--seq 64 --steps 1 --plan " + plan + " --report " + rep.string() + " --init-from " +
                                    hf.string()));
    EXPECT_EQ(r.code, 0) << r.out;
    if (r.code != 0) return -1.0;
    return nlohmann::json::parse(slurp(rep))["losses"][0].get<double>();
  };
  double one = first_loss(1, "precision=fp32");
  double tp2 = first_loss(2, "tp=2,precision=fp32");
  double tpcp = first_loss(4, "tp=2,cp=2,zero=3,precision=fp32");
  EXPECT_NEAR(one, tp2, 1e-5 * std::fabs(one));
  EXPECT_NEAR(one, tpcp, 1e-5 * std::fabs(one));
  EXPECT_LT(one, la.front() - 0.05) << "the exported weights made no difference to the first loss";
  // a sharded checkpoint folder is not a Hugging Face folder: refused with the way to make one
  Result notHf = sh(ctxrun(1, "--model tiny --seq 64 --steps 1 --init-from " + (a / "step-000006").string()));
  EXPECT_EQ(notHf.code, 2) << notHf.out;
  EXPECT_NE(notHf.out.find("--export-hf"), std::string::npos) << notHf.out;
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

// Issue 20: cycle and split:k are priced but not executed: refused naming the key, the value and
// what runs; a headtail-doc document that 2*cp does not divide is refused naming both.
TEST(ExecCli, VarlenStrategiesCtxrunDoesNotRunAreRefusedNamingTheKey) {
  Result r = sh(ctxrun(2, "--model tiny --seq 64 --steps 1 --plan cp=2,mask=doc:16,cp_varlen=cycle"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("cp_varlen=cycle"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cp_varlen=native"), std::string::npos) << r.out;
  r = sh(ctxrun(2, "--model tiny --seq 64 --steps 1 --plan cp=2,cp_comm=p2p,cp_layout=headtail-doc,mask=doc:10"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("cp_layout=headtail-doc"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mask=doc:10"), std::string::npos) << r.out;
}

// Issue 21: ctxrun does not pad. A plan with pad=1 that would pad is refused naming the key and the
// lengths that run; without pad=1 the refusal lists those lengths and not pad=1 (no way out here).
TEST(ExecCli, PadThatWouldPadIsRefusedNamingTheKey) {
  Result r = sh(ctxrun(2, "--model tiny --seq 66 --steps 1 --plan cp=2,cp_kind=zigzag,pad=1"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("ctxrun does not pad sequences: pad=1 would pad 66 tokens to 68"), std::string::npos) << r.out;
  r = sh(ctxrun(2, "--model tiny --seq 66 --steps 1 --plan cp=2,cp_kind=zigzag"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("nearest valid: --seq 64 | --seq 68"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("pad=1"), std::string::npos) << r.out;
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
  std::string before = slurp(d / "step-000002" / "rank-00000.safetensors");
  ASSERT_FALSE(before.empty());
  Result b = sh(ctxrun(1, "--model tiny-nope --seq 64 --steps 4 --resume --ckpt-dir " + d.string()));
  EXPECT_EQ(b.code, 2) << b.out;
  EXPECT_NE(b.out.find("trainer.json"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("tiny-nope"), std::string::npos) << b.out;
  EXPECT_TRUE(before == slurp(d / "step-000002" / "rank-00000.safetensors"));
}

TEST(ExecCli, NanLossStopsNamingStepAndLayerWithoutTouchingCheckpoints) {
  fs::path d = scratch("nan");
  Result a = sh(ctxrun(2, "--model tiny --seq 64 --steps 2 --plan tp=2 --ckpt-dir " + d.string()));
  ASSERT_EQ(a.code, 0) << a.out;
  std::string before = slurp(d / "step-000002" / "rank-00000.safetensors");
  Result b = sh(ctxrun(2, "--model tiny --seq 64 --steps 6 --plan tp=2 --resume --save-every 1 --debug-nan 4:1 --ckpt-dir " +
                              d.string()));
  EXPECT_EQ(b.code, ctx::kExitDiverged) << b.out;
  EXPECT_NE(b.out.find("step 4"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("layer 1"), std::string::npos) << b.out;
  EXPECT_TRUE(before == slurp(d / "step-000002" / "rank-00000.safetensors"));
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
  std::string before = slurp(d / "step-000002" / "rank-00000.safetensors");
  Result b = sh("timeout 60 " + ctxrun(2, "--model tiny --seq 64 --steps 5 --plan cp=2 --resume --debug-fail 1:4 --ckpt-dir " +
                                              d.string()));
  EXPECT_NE(b.code, 0) << b.out;
  EXPECT_NE(b.code, 124) << "ranks hung after one failed:\n" << b.out;
  EXPECT_NE(b.out.find("internal error on rank 1"), std::string::npos) << b.out;
  EXPECT_NE(b.out.find("injected failure"), std::string::npos) << b.out;
  EXPECT_TRUE(before == slurp(d / "step-000002" / "rank-00000.safetensors"));
  EXPECT_EQ(slurp(d / "latest"), "step-000002\n");
}

// --export-hf writes a Hugging Face Llama checkpoint (config.json + model.safetensors with HF
// tensor names), a valid --init-from source: without --model the run takes the architecture
// from config.json, the first loss is the same under any plan and differs from a fresh start,
// and weights of another architecture are refused naming the file.
TEST(ExecCli, InitFromHuggingFaceFolderLoadsConfigAndWeightsUnderAnyPlan) {
  fs::path d = scratch("initfrom");
  fs::path hf = d / "hf";
  Result a = sh(ctxrun(1, "--model tiny --seq 64 --steps 3 --export-hf " + hf.string()));
  ASSERT_EQ(a.code, 0) << a.out;
  ASSERT_TRUE(fs::exists(hf / "config.json"));
  nlohmann::json cfg = nlohmann::json::parse(slurp(hf / "config.json"));
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["num_hidden_layers"], 2);
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_NE(slurp(hf / "model.safetensors").find("model.layers.1.self_attn.q_proj.weight"), std::string::npos);
  auto first_loss = [&](int ranks, const std::string& args) {
    fs::path rep = d / (std::string("r") + std::to_string(ranks) + ".json");
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
