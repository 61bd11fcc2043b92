// pad=1 (issue 21, part 6): a sequence the CP/TP layout cannot split is padded up to the layout's
// multiple (seq_granule) and the padding is priced, instead of refused.
//   - the key parses, prints only when set and round-trips through the plan string, plan JSON and a
//     ctxplan.plan/1 file; without it the refusal is unchanged and names pad=1 among the ways out;
//   - memory and time are priced at the padded length, tokens/s counts the real tokens: the padded
//     length and the memory delta stated by hand (host checkpoints, which carry no allocator slack);
//   - the search pads when --plan says pad=1 and otherwise counts the plans it left out;
//   - ctxplan launch (ctxrun) refuses a plan that pads, naming the key.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "costmodel/errors.hpp"
#include "costmodel/memory_model.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/prediction.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/step_model.hpp"
#include "planner/search.hpp"
#include "built_in_profiles.hpp"

namespace ctx {
namespace {

const Profiles& profiles() { return testing::built_in_profiles(); }
testing::RunResult ctxplan(std::vector<std::string> args) { return testing::ctxplan_with_built_in_profiles(std::move(args)); }

// zig-zag over cp=8 cuts the sequence in 2*cp = 16 chunks: 131000 = 16 x 8187 + 8, so it pads by 8 to
// 131008 = 16 x 8188; the nearest valid lengths are 130992 and 131008.
constexpr int64_t kSeq = 131000, kPadded = 131008, kBelow = 130992;
const char* kPlan = "cp=8,cp_kind=zigzag,zero=3,recompute=full,ckpt_offload=1";

TEST(Pad, KeyParsesPrintsWhenSetAndRoundTrips) {
  EXPECT_FALSE(parse_plan("cp=8").pad);
  EXPECT_EQ(plan_to_string(parse_plan("cp=8")).find("pad"), std::string::npos);
  const Plan p = parse_plan(std::string(kPlan) + ",pad=1");
  EXPECT_TRUE(p.pad);
  const std::string text = plan_to_string(p);
  EXPECT_NE(text.find(",pad=1"), std::string::npos) << text;
  EXPECT_EQ(plan_to_string(parse_plan(text)), text);
  const json j = plan_to_json(p);
  EXPECT_EQ(j.at("pad"), true);
  EXPECT_EQ(plan_to_string(plan_from_json(j, "test")), text);
  EXPECT_FALSE(plan_from_json(plan_to_json(parse_plan("cp=8")), "test").pad);
  try {
    parse_plan("pad=2");
    ADD_FAILURE() << "pad=2 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("pad"), std::string::npos) << e.what();
  }
}

TEST(Pad, PaddedLengthIsTheLayoutsNextMultiple) {
  Plan zz = parse_plan("cp=8,cp_kind=zigzag,pad=1");
  EXPECT_EQ(seq_granule(zz), 16);
  EXPECT_EQ(padded_seq(zz, kSeq), kPadded);
  EXPECT_EQ(padded_seq(zz, kPadded), kPadded) << "a length that divides is not padded";
  // contiguous ring: cp = 8 ranks; 131000 = 8 x 16375 divides, nothing to pad
  EXPECT_EQ(padded_seq(parse_plan("cp=8,cp_kind=ring,pad=1"), kSeq), kSeq);
  // tp=2 with SP and a contiguous layout: cp*tp = 4 x 2 = 8; 1001 pads to 1008
  EXPECT_EQ(padded_seq(parse_plan("tp=2,cp=4,cp_kind=ring,pad=1"), 1001), 1008);
  // pad=0: the length as given (check_plan refuses it)
  EXPECT_EQ(padded_seq(parse_plan("cp=8,cp_kind=zigzag"), kSeq), kSeq);
}

TEST(Pad, WithoutPadTheRefusalIsUnchangedAndNamesPad) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "8xh100");
  Plan p = parse_plan(kPlan);
  const PlanCheck r = check_plan(p, m, c, kSeq);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.message(), "cp_layout=headtail needs the sequence divisible by 2*cp = 16, got 131000; "
                         "nearest valid: --seq 130992 | --seq 131008 | pad=1");
  Plan padded = parse_plan(std::string(kPlan) + ",pad=1");
  const PlanCheck ok = check_plan(padded, m, c, kSeq);
  ASSERT_TRUE(ok.ok()) << ok.message();
  bool said = false;
  for (const std::string& w : ok.warnings) said = said || w.find("8 pad tokens") != std::string::npos;
  EXPECT_TRUE(said) << "the warning says how many pad tokens";

  const auto refused = ctxplan({"predict", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", std::to_string(kSeq),
                                "--runtime", "ctxrun-cuda", "--plan", kPlan});
  EXPECT_EQ(refused.exit_code, 2) << refused.both();
  EXPECT_NE(refused.err.find("pad=1"), std::string::npos) << refused.err;
}

// Host checkpoints under recompute=full,ckpt_offload=1 are every layer's input [tokens per rank, h]
// in bf16 for each of the node's 8 ranks (memory_model.cpp; pinned host buffers carry no allocator
// slack): 8 ranks x 32 layers x (seq/8) tokens x 4096 x 2 bytes. Padded: seq = 131008, 16376 tokens
// per rank, 8 x 32 x 16376 x 4096 x 2 = 34,342,961,152 bytes; against 130992 (the longest valid
// length without padding, 16374 tokens per rank) the 16 more tokens are 8 x 32 x 2 x 4096 x 2 =
// 4,194,304 bytes.
TEST(Pad, MemoryAndTimeArePricedAtThePaddedLengthThroughputAtTheRealOne) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "8xh100");
  const RuntimeProfile& rt = resolve_runtime(profiles(), "ctxrun-cuda");
  const Prediction pad = predict(m, c, rt, parse_plan(std::string(kPlan) + ",pad=1"), kSeq);
  const Prediction at_padded = predict(m, c, rt, parse_plan(kPlan), kPadded);
  const Prediction below = predict(m, c, rt, parse_plan(kPlan), kBelow);
  EXPECT_EQ(pad.seq, kSeq);
  EXPECT_EQ(pad.pad_tokens, kPadded - kSeq);
  EXPECT_EQ(at_padded.pad_tokens, 0);
  const int host = static_cast<int>(HostMem::checkpoints);
  EXPECT_DOUBLE_EQ(pad.memory.host_bytes_per_node[host], 34342961152.0);
  EXPECT_DOUBLE_EQ(pad.memory.host_bytes_per_node[host] - below.memory.host_bytes_per_node[host], 4194304.0);
  // every other figure is the padded length's: the same bytes, the same step
  EXPECT_EQ(pad.memory.peak.total(), at_padded.memory.peak.total());
  EXPECT_EQ(pad.time.step_seconds, at_padded.time.step_seconds);
  EXPECT_EQ(pad.time_closed_form.step_seconds, at_padded.time_closed_form.step_seconds);
  EXPECT_GT(pad.time.step_seconds, below.time.step_seconds) << "the pad tokens cost time";
  EXPECT_EQ(pad.time.mfu, at_padded.time.mfu) << "MFU counts the FLOPs the GPUs run, pad tokens included";
  // tokens/s: 131000 real tokens per step (dp=1, one sequence) over the padded length's step time
  EXPECT_DOUBLE_EQ(pad.time.tokens_per_second, static_cast<double>(kSeq) / pad.time.step_seconds);
  EXPECT_DOUBLE_EQ(at_padded.time.tokens_per_second, static_cast<double>(kPadded) / at_padded.time.step_seconds);
  const json j = prediction_to_json(pad);
  EXPECT_EQ(j.at("pad_tokens"), 8);
  EXPECT_EQ(j.at("seq"), kSeq);
}

TEST(Pad, PlanFileCarriesPadAndPredictReportsThePadTokens) {
  const std::string path = ::testing::TempDir() + "/pad_plan.json";
  {
    std::ofstream f(path);
    f << R"({"schema":"ctxplan.plan/1","model":"Llama-3.1-8B","cluster":"8xh100","seq":131000,"runtime":"megatron",)"
      << R"("plan":{"cp":8,"cp_kind":"zigzag","zero":3,"recompute":"full","pad":true}})";
  }
  const auto r = ctxplan({"predict", "--plan-file", path, "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.both();
  const json j = json::parse(r.out);
  EXPECT_EQ(j.at("pad_tokens"), 8);
  EXPECT_EQ(j.at("plan").at("pad"), true);
  const auto text = ctxplan({"predict", "--plan-file", path});
  EXPECT_NE(text.out.find("8 pad tokens per sequence"), std::string::npos) << text.out;
  // simulate says it too, and prices the same padded step as predict
  const auto sim = ctxplan({"simulate", "--plan-file", path});
  ASSERT_EQ(sim.exit_code, 0) << sim.both();
  EXPECT_NE(sim.out.find("8 pad tokens per sequence, memory and time priced at 131008 tokens"), std::string::npos) << sim.out;
  const auto sim_json = ctxplan({"simulate", "--plan-file", path, "--json"});
  ASSERT_EQ(sim_json.exit_code, 0) << sim_json.both();
  EXPECT_EQ(json::parse(sim_json.out).at("pad_tokens"), 8);
  EXPECT_DOUBLE_EQ(json::parse(sim_json.out).at("time").at("step_seconds").get<double>(), j.at("time").at("step_seconds").get<double>());
  std::remove(path.c_str());
}

// The search pads only when --plan says pad=1 (a constraint like any key) and otherwise says how many
// plans it left out because their layout does not divide the sequence. With pad=1 it prices those
// plans too; at a length every layout divides, pad=1 changes nothing.
TEST(Pad, SearchPadsWhenToldAndCountsThePlansItLeftOut) {
  SearchRequest req;
  req.model = resolve_model(profiles(), "Llama-3.1-8B");
  req.cluster = resolve_cluster(profiles(), "8xh100");
  req.runtime = resolve_runtime(profiles(), "ctxrun-cuda");
  req.seq = kSeq;
  req.refine = 0;
  for (const Plan& p : enumerate_plans(req)) EXPECT_FALSE(p.pad) << plan_to_string(p);
  const SearchResult plain = search_plans(req);
  EXPECT_GT(plain.not_dividing, 0);
  for (const Candidate& c : plain.ranked) EXPECT_EQ(kSeq % seq_granule(c.plan), 0) << plan_to_string(c.plan);

  SearchRequest padded = req;
  padded.base = parse_plan("pad=1");
  padded.fixed_fields = fixed_plan_fields("pad=1", "--plan");
  for (const Plan& p : enumerate_plans(padded)) EXPECT_TRUE(p.pad) << plan_to_string(p);
  const SearchResult r = search_plans(padded);
  EXPECT_EQ(r.not_dividing, 0);
  // the padded search accepts what the plain one did and some of what it left out
  EXPECT_GT(r.valid, plain.valid);
  EXPECT_LE(r.valid, plain.valid + plain.not_dividing);
  bool zigzag = false;
  for (const Candidate& c : r.ranked) zigzag = zigzag || (c.plan.cp > 1 && kSeq % seq_granule(c.plan) != 0);
  EXPECT_TRUE(zigzag) << "head-tail plans at 131000 tokens are priced padded";

  // 131072 = 2^17: every layout divides it, pad=1 is a no-op
  req.seq = padded.seq = 131072;
  const SearchResult a = search_plans(req), b = search_plans(padded);
  EXPECT_EQ(a.not_dividing, 0);
  EXPECT_EQ(a.valid, b.valid);
  ASSERT_FALSE(a.ranked.empty());
  EXPECT_EQ(a.ranked.front().time.tokens_per_second, b.ranked.front().time.tokens_per_second);
}

// export writes the padded length the step was priced at, and says so in a note
TEST(Pad, ExportWritesThePaddedLengthAndSaysSo) {
  const auto r = ctxplan({"export", "megatron", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", std::to_string(kSeq), "--plan",
                          "cp=8,cp_kind=zigzag,zero=1,recompute=full,pad=1"});
  ASSERT_EQ(r.exit_code, 0) << r.both();
  EXPECT_NE(r.out.find("--seq-length " + std::to_string(kPadded)), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("--seq-length " + std::to_string(kSeq)), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("pad=1: written for the padded length 131008 (131000 tokens + 8 pad tokens per sequence"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("seq 131000 tokens (padded to 131008)"), std::string::npos) << r.err;
  // without padding nothing changes
  const auto plain = ctxplan({"export", "megatron", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", std::to_string(kPadded),
                              "--plan", "cp=8,cp_kind=zigzag,zero=1,recompute=full,pad=1"});
  ASSERT_EQ(plain.exit_code, 0) << plain.both();
  EXPECT_NE(plain.out.find("--seq-length " + std::to_string(kPadded)), std::string::npos) << plain.out;
  EXPECT_EQ(plain.err.find("pad=1: written"), std::string::npos) << plain.err;
}

TEST(Pad, LaunchRefusesAPlanThatPads) {
  const auto r = ctxplan({"launch", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", std::to_string(kSeq), "--plan",
                          std::string(kPlan) + ",pad=1", "--local"});
  EXPECT_EQ(r.exit_code, 2) << r.both();
  EXPECT_NE(r.err.find("pad=1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ctxrun does not pad"), std::string::npos) << r.err;
  // without pad=1 the length is refused with the lengths that run, and not pad=1 (ctxrun does not pad)
  const auto plain = ctxplan({"launch", "--model", "Llama-3.1-8B", "--cluster", "8xh100", "--seq", std::to_string(kSeq), "--plan",
                              kPlan, "--local"});
  EXPECT_EQ(plain.exit_code, 2) << plain.both();
  EXPECT_NE(plain.err.find("--seq 130992 | --seq 131008"), std::string::npos) << plain.err;
  EXPECT_EQ(plain.err.find("pad=1"), std::string::npos) << plain.err;
}

}  // namespace
}  // namespace ctx
