// HSDP (issue 21, part 4): plan key zero_shard = n, the ranks of the dp x cp grid that shard the
// model states; the dp*cp/n groups of them replicate. Proves:
//   - the key round-trips through text and JSON, and plan_check refuses what cannot run naming it;
//   - the rank grid: shard groups are consecutive blocks of the zero group (cp innermost), replicate
//     groups take one rank of each block, the two are orthogonal; group_placement's axis fast path
//     agrees with an enumeration of the listed groups on every node size;
//   - the Done-when: Llama-3.1-8B on 2x8 H100, dp=16,zero=3 vs dp=16,zero=3,zero_shard=8: HSDP moves
//     fewer bytes between nodes and holds more model-state bytes per GPU, exactly as derived below,
//     and its breakdown names the shard group's reduce-scatter and the replicate all-reduce;
//   - the search tries zero_shard = GPUs per node / tp for ZeRO plans and keeps a user's zero_shard;
//     a runtime that does not state the capability is refused naming zero_shard.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "costmodel/collectives.hpp"
#include "costmodel/plan_check.hpp"
#include "costmodel/prediction.hpp"
#include "costmodel/process_groups.hpp"
#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_capabilities.hpp"
#include "costmodel/zero_comm.hpp"
#include "planner/search.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(std::string(CTXPLAN_SOURCE_DIR) + "/profiles");
  return p;
}

TEST(HsdpPlanKey, RoundTripsThroughTextAndJson) {
  Plan p = parse_plan("dp=16,zero=3,zero_shard=8");
  EXPECT_EQ(p.zero_shard, 8);
  EXPECT_EQ(zero_shard_degree(p), 8);
  EXPECT_EQ(zero_replicate_degree(p), 2);
  EXPECT_NE(plan_to_string(p).find("zero_shard=8"), std::string::npos);
  EXPECT_EQ(parse_plan(plan_to_string(p)).zero_shard, 8);
  EXPECT_EQ(plan_from_json(plan_to_json(p), "test").zero_shard, 8);
  Plan flat = parse_plan("dp=4,cp=2,zero=1");  // 0: all dp*cp ranks, today's meaning
  EXPECT_EQ(zero_shard_degree(flat), 8);
  EXPECT_EQ(zero_replicate_degree(flat), 1);
  EXPECT_EQ(plan_to_string(flat).find("zero_shard"), std::string::npos);
}

TEST(HsdpPlanKey, PlanCheckRefusesWhatCannotRunNamingTheKey) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "2x8xh100");
  struct Bad { const char* plan; const char* says; };
  for (Bad b : {Bad{"dp=16,zero=3,zero_shard=3", "must divide dp*cp = 16"}, Bad{"dp=16,zero=3,zero_shard=1", "be > 1"},
                Bad{"dp=16,zero_shard=8", "needs zero>=1"}, Bad{"dp=8,cp=2,zero=2,zero_shard=32", "must divide dp*cp = 16"}}) {
    Plan p = parse_plan(b.plan);
    PlanCheck r = check_plan(p, m, c, 8192);
    ASSERT_FALSE(r.ok()) << b.plan;
    EXPECT_NE(r.message().find("zero_shard"), std::string::npos) << r.message();
    EXPECT_NE(r.message().find(b.says), std::string::npos) << r.message();
  }
  for (const char* ok : {"dp=16,zero=3,zero_shard=8", "dp=8,cp=2,zero=1,zero_shard=4", "dp=16,zero=2,zero_shard=16"}) {
    Plan p = parse_plan(ok);
    EXPECT_TRUE(check_plan(p, m, c, 8192).ok()) << ok;
  }
}

// Plans with resolved degrees; zero_shard inside cp, across whole cp rows, and neither (3 of dp=3 x cp=2).
std::vector<std::string> grid_plans() {
  return {"dp=16,zero=3,zero_shard=8",
          "dp=4,tp=2,cp=2,zero=3,zero_shard=2",
          "dp=4,tp=2,cp=2,zero=1,zero_shard=4",
          "dp=2,tp=1,cp=8,cp_kind=usp,ulysses=2,zero=2,zero_shard=4",
          "dp=4,tp=2,cp=2,zero=3,zero_shard=4,order=dp-cp-tp",
          "dp=3,tp=2,cp=2,zero=3,zero_shard=3",
          "dp=3,tp=1,cp=2,zero=3,zero_shard=3,order=cp-dp-tp",
          "dp=4,tp=1,cp=4,zero=3,zero_shard=16"};
}

// The reference: the zero group (its own order, cp innermost) cut into blocks of n.
TEST(HsdpRankGrid, ShardBlocksAndReplicasPartitionTheZeroGroupOrthogonally) {
  for (const std::string& text : grid_plans()) {
    const Plan p = parse_plan(text);
    const int64_t n = zero_shard_degree(p), world = p.dp * p.tp * p.cp;
    std::set<std::vector<int64_t>> shards, replicas;
    for (int64_t r = 0; r < world; ++r) {
      const std::vector<int64_t> zg = group_ranks(p, Group::zero, r);
      const int64_t pos = std::find(zg.begin(), zg.end(), r) - zg.begin();
      std::vector<int64_t> want_shard(zg.begin() + pos / n * n, zg.begin() + pos / n * n + n), want_rep;
      for (int64_t k = pos % n; k < static_cast<int64_t>(zg.size()); k += n) want_rep.push_back(zg[static_cast<size_t>(k)]);
      const std::vector<int64_t> shard = group_ranks(p, Group::zero_shard, r), rep = group_ranks(p, Group::zero_replicate, r);
      EXPECT_EQ(shard, want_shard) << text << " rank " << r;
      EXPECT_EQ(rep, want_rep) << text << " rank " << r;
      // orthogonal: this rank is the only one in both
      std::vector<int64_t> both;
      for (int64_t x : shard)
        if (std::count(rep.begin(), rep.end(), x)) both.push_back(x);
      EXPECT_EQ(both, std::vector<int64_t>{r}) << text;
      shards.insert(std::vector<int64_t>(shard.begin(), shard.end()));
      replicas.insert(rep);
    }
    // each rank in exactly one group of each kind: world/n shard groups of n, world/R replica groups
    EXPECT_EQ(static_cast<int64_t>(shards.size()) * n, world) << text;
    EXPECT_EQ(static_cast<int64_t>(replicas.size()) * zero_replicate_degree(p), world) << text;
  }
}

// group_placement (axes, or the listed-groups fallback) against a brute-force count over every group.
TEST(HsdpRankGrid, PlacementMatchesEveryListedGroup) {
  for (const std::string& text : grid_plans()) {
    const Plan p = parse_plan(text);
    const int64_t world = p.dp * p.tp * p.cp;
    for (int64_t gpn : {1, 2, 4, 8, 16})
      for (Group g : {Group::zero_shard, Group::zero_replicate}) {
        int64_t nodes = 0, per_node = world;
        for (int64_t r = 0; r < world; ++r) {
          std::map<int64_t, int64_t> on;
          for (int64_t x : group_ranks(p, g, r)) ++on[x / gpn];
          nodes = std::max<int64_t>(nodes, static_cast<int64_t>(on.size()));
          for (auto& [node, k] : on) per_node = std::min(per_node, k);
        }
        const GroupPlacement got = group_placement(p, g, gpn);
        EXPECT_EQ(got.size, static_cast<int64_t>(group_ranks(p, g, 0).size())) << text << " gpn " << gpn;
        EXPECT_EQ(got.nodes, nodes) << text << " gpn " << gpn << (g == Group::zero_shard ? " shard" : " replicate");
        EXPECT_EQ(got.per_node, per_node) << text << " gpn " << gpn << (g == Group::zero_shard ? " shard" : " replicate");
      }
  }
  // the default order puts a shard of GPUs-per-node ranks on one node, its replicas one per node
  const Plan p = parse_plan("dp=16,zero=3,zero_shard=8");
  EXPECT_EQ(nodes_spanned(p, Group::zero_shard, 8), 1);
  EXPECT_EQ(nodes_spanned(p, Group::zero_replicate, 8), 2);
}

// Done-when. Llama-3.1-8B (L=32, h=4096, 32 query heads and 8 KV heads of 128, ffn 14336, V=128256,
// untied head) has P = L(2h*4096 + 2h*1024 + 3h*ffn + 2h) + 2Vh + h parameters, all on each rank at
// tp=1. torchtitan moves weights in bf16 (wb=2) and reduces gradients in fp32 (gb=4), ga=1.
//   zero=3 over 16 (one group, 8 per node on 2 nodes; collectives.hpp: a node's NICs carry
//   bytes x bus factor, shared by its 8 members): weights all-gathered twice (forward, backward),
//   gradients reduce-scattered once, bus factor 15/16:
//       inter-node bytes per GPU = (2 wb + gb) P x 15/16 / 8 = 8P x 15/128
//   zero_shard=8: the all-gathers and the reduce-scatter stay inside a node (0 bytes); the shard
//   (P/8 gradients) is all-reduced over 2 replicas, one per node, bus factor 2(2-1)/2 = 1:
//       inter-node bytes per GPU = gb P / 8 = 4P/8
//   Model states per GPU: weights wb P / Z, master (2 bytes, torchtitan's fp32 shard split)
//   mb P / Z, Adam 8 P / Z, with Z = 16 and 8: HSDP holds twice FSDP's.
TEST(HsdpDoneWhen, LessInterNodeTrafficMoreMemoryBothTermsInTheBreakdown) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "2x8xh100");
  const RuntimeProfile rt = resolve_runtime(profiles(), "torchtitan");
  const double L = 32, h = 4096, ffn = 14336, V = 128256;
  const double P = L * (2 * h * 4096 + 2 * h * 1024 + 3 * h * ffn + 2 * h) + 2 * V * h + h;
  ASSERT_EQ(rt.weight_bytes, 2);
  ASSERT_EQ(rt.grad_bytes, 4);
  const Prediction fsdp = predict(m, c, rt, parse_plan("dp=16,zero=3,recompute=full"), 8192);
  const Prediction hsdp = predict(m, c, rt, parse_plan("dp=16,zero=3,zero_shard=8,recompute=full"), 8192);
  auto inter = [](const Prediction& x) {
    double b = 0;
    for (auto& t : x.zero_comm) b += t.inter_node_bytes_per_rank;
    return b;
  };
  const double tol = 1e-12;  // sums of a few doubles of ~1e10
  EXPECT_NEAR(inter(fsdp), 8 * P * 15 / 128, tol * P);
  EXPECT_NEAR(inter(hsdp), 4 * P / 8, tol * P);
  EXPECT_LT(inter(hsdp), inter(fsdp));
  // both HSDP terms, where the cluster puts them
  std::map<std::string, ZeroCommTerm> terms;
  for (auto& t : hsdp.zero_comm) terms[t.name] = t;
  ASSERT_TRUE(terms.count("grad_reduce_scatter"));
  ASSERT_TRUE(terms.count("grad_replicate_all_reduce"));
  ASSERT_TRUE(terms.count("zero3_param_all_gather"));
  EXPECT_EQ(terms["grad_reduce_scatter"].where.size, 8);
  EXPECT_EQ(terms["grad_reduce_scatter"].where.nodes, 1);
  EXPECT_EQ(terms["grad_replicate_all_reduce"].where.size, 2);
  EXPECT_EQ(terms["grad_replicate_all_reduce"].where.nodes, 2);
  EXPECT_NEAR(terms["grad_replicate_all_reduce"].message_bytes, 4 * P / 8, tol * P);
  EXPECT_EQ(terms["zero3_param_all_gather"].where.nodes, 1);
  const json j = prediction_to_json(hsdp);
  EXPECT_EQ(j["data_parallel_comm"]["terms"].size(), 3u);
  EXPECT_EQ(j["data_parallel_comm"]["zero_replicate"], 2);
  // memory: the model states sharded over 8 instead of 16
  for (auto [cat, bytes] : {std::pair{Mem::weights, rt.weight_bytes}, std::pair{Mem::master_weights, rt.master_bytes},
                            std::pair{Mem::optimizer, rt.optimizer_bytes}}) {
    const int i = static_cast<int>(cat);
    EXPECT_NEAR(fsdp.memory.phase_peak[static_cast<int>(Phase::optimizer)].bytes[i], bytes * P / 16, tol * P) << to_string(cat);
    EXPECT_NEAR(hsdp.memory.phase_peak[static_cast<int>(Phase::optimizer)].bytes[i], bytes * P / 8, tol * P) << to_string(cat);
  }
  EXPECT_GT(hsdp.memory.peak.total(), fsdp.memory.peak.total());
}

// ZeRO-1 under HSDP is Megatron's distributed-optimizer instances: the gradients reduce-scatter in
// the instance and the shard is all-reduced across instances; the updated weights all-gather in the
// instance. Llama-3.1-8B on 2x8, megatron (fp32 gradients gb = 4, bf16 weights wb = 2), ga = 1:
//   dp=16,zero=1: all-reduce over 16 ranks, 8 per node, bus factor 2*15/16: gb P x 30/16 / 8 = 15P/16
//                 between nodes per GPU, plus the weights' all-gather over 16: wb P x 15/16 / 8 = 15P/64
//   zero_shard=8: reduce-scatter and all-gather inside a node, the shard's all-reduce over 2 nodes,
//                 bus factor 1, one GPU per node: gb P / 8 = P/2
TEST(HsdpZero1, IsMegatronsOptimizerInstances) {
  const ModelSpec m = resolve_model(profiles(), "Llama-3.1-8B");
  const ClusterSpec c = resolve_cluster(profiles(), "2x8xh100");
  const RuntimeProfile rt = resolve_runtime(profiles(), "megatron");
  ASSERT_EQ(rt.grad_bytes, 4);
  ASSERT_EQ(rt.weight_bytes, 2);
  const double L = 32, h = 4096, ffn = 14336, V = 128256;
  const double P = L * (2 * h * 4096 + 2 * h * 1024 + 3 * h * ffn + 2 * h) + 2 * V * h + h;
  const LocalShapes flat_s = local_shapes(m, parse_plan("dp=16,zero=1"), 8192);
  auto inter = [&](const char* text) {
    double b = 0;
    for (auto& t : zero_comm_terms(parse_plan(text), flat_s, rt, 8)) b += t.inter_node_bytes_per_rank;
    return b;
  };
  EXPECT_NEAR(inter("dp=16,zero=1"), 15 * P / 16 + 15 * P / 64, 1e-12 * P);
  EXPECT_NEAR(inter("dp=16,zero=1,zero_shard=8"), P / 2, 1e-12 * P);
  std::vector<std::string> names;
  for (auto& t : zero_comm_terms(parse_plan("dp=16,zero=1,zero_shard=8"), flat_s, rt, 8)) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"grad_reduce_scatter", "grad_replicate_all_reduce", "param_all_gather"}));
}

SearchRequest request(const char* runtime) {
  SearchRequest req;
  req.model = resolve_model(profiles(), "Llama-3.1-8B");
  req.cluster = resolve_cluster(profiles(), "2x8xh100");
  req.runtime = resolve_runtime(profiles(), runtime);
  req.seq = 32768;
  req.global_batch_tokens = 16 * req.seq;
  return req;
}

// Every ZeRO plan the search tries over more than one node's dp x cp ranks is tried again with
// zero_shard = GPUs per node / tp, and no other zero_shard appears.
TEST(HsdpSearch, TriesOneNodeShardsForEveryZeroPlan) {
  const std::vector<Plan> plans = enumerate_plans(request("torchtitan"));
  std::set<std::string> flat, hsdp;
  for (const Plan& p : plans) {
    if (p.zero_shard == 0) {
      flat.insert(plan_to_string(p) + order_to_string(p));
      continue;
    }
    EXPECT_GE(p.zero, 1) << plan_to_string(p);
    EXPECT_EQ(p.zero_shard, 8 / p.tp) << plan_to_string(p);
    Plan same = p;
    same.zero_shard = 0;
    hsdp.insert(plan_to_string(same) + order_to_string(same));
  }
  ASSERT_FALSE(hsdp.empty());
  for (const Plan& p : plans) {
    const int64_t n = 8 / p.tp, dpcp = p.dp * p.cp;
    if (p.zero_shard == 0 && p.zero >= 1 && n > 1 && n < dpcp && dpcp % n == 0) {
      EXPECT_TRUE(hsdp.count(plan_to_string(p) + order_to_string(p))) << plan_to_string(p);
    }
  }
  for (const std::string& s : hsdp) EXPECT_TRUE(flat.count(s)) << s;
}

TEST(HsdpSearch, AUsersZeroShardIsKeptAndARuntimeWithoutTheCapabilityRefusesIt) {
  SearchRequest req = request("torchtitan");
  req.base = parse_plan("zero_shard=8");
  req.fixed_fields = fixed_plan_fields("zero_shard=8", "--plan");
  const SearchResult r = search_plans(req);
  ASSERT_FALSE(r.ranked.empty());
  for (const Candidate& cand : r.ranked) EXPECT_EQ(cand.plan.zero_shard, 8) << plan_to_string(cand.plan);
  RuntimeCapabilities caps = req.runtime.capabilities;
  // torchtitan: FSDP2 (zero 2/3, and 1 = FSDP under pipeline stages) on a dp_replicate x dp_shard mesh
  EXPECT_EQ(caps.zero_shard, (std::vector<int>{1, 2, 3}));
  EXPECT_NE(missing_capability(caps, "torchtitan", parse_plan("dp=16,zero=1,zero_shard=8")), "");  // zero=1 needs pp > 1
  EXPECT_EQ(missing_capability(caps, "torchtitan", parse_plan("dp=8,pp=2,zero=1,zero_shard=4,ga=2")), "");
  EXPECT_EQ(missing_capability(caps, "torchtitan", parse_plan("dp=16,zero=3,zero_shard=8")), "");
  caps.zero_shard = {3};  // DeepSpeed MiCS: ZeRO-3 only
  std::string why = missing_capability(caps, "torchtitan", parse_plan("dp=16,zero=2,zero_shard=8"));
  EXPECT_NE(why.find("zero_shard=8 with zero=2"), std::string::npos) << why;
  EXPECT_NE(why.find("HSDP with zero 3 only"), std::string::npos) << why;
  caps.zero_shard.clear();  // a declared set without the capability
  why = missing_capability(caps, "torchtitan", parse_plan("dp=16,zero=3,zero_shard=8"));
  EXPECT_NE(why.find("zero_shard=8"), std::string::npos) << why;
  EXPECT_EQ(missing_capability(caps, "torchtitan", parse_plan("dp=16,zero=3,zero_shard=16")), "");  // one group: no HSDP
  EXPECT_EQ(missing_capability(caps, "torchtitan", parse_plan("dp=16,zero=3")), "");
  // the built-in stacks' statements (profiles/runtimes/*.json), each with its source
  for (auto [runtime, stages] : {std::pair{"megatron", std::vector<int>{1}}, std::pair{"hf-deepspeed", std::vector<int>{3}},
                                 std::pair{"ctxrun-cpu", std::vector<int>{1, 2, 3}}}) {
    const RuntimeCapabilities c = resolve_runtime(profiles(), runtime).capabilities;
    EXPECT_EQ(c.zero_shard, stages) << runtime;
    EXPECT_FALSE(c.sources.at("zero_shard").empty()) << runtime;
  }
}

}  // namespace
}  // namespace ctx
