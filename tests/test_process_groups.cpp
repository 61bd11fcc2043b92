// Process groups from a plan's degrees and rank order: the groups of each kind partition the
// ranks, have the planned sizes, and sit where the rank order says they sit.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "costmodel/plan.hpp"
#include "costmodel/process_groups.hpp"

using namespace ctx;

namespace {

// Plans with every degree resolved (dp given explicitly), covering each rank order and CP kind.
std::vector<std::string> plan_texts() {
  return {
      "dp=8,tp=1,cp=1",
      "dp=2,tp=4,cp=1",
      "dp=1,tp=8,cp=1",
      "dp=2,tp=2,cp=2",
      "dp=2,tp=2,cp=4,cp_kind=zigzag",
      "dp=2,tp=2,cp=4,cp_kind=ring,order=dp-cp-tp",
      "dp=3,tp=2,cp=2,order=cp-dp-tp",
      "dp=2,tp=1,cp=8,cp_kind=ulysses",
      "dp=2,tp=2,cp=8,cp_kind=usp,ulysses=4",
      "dp=1,tp=2,cp=8,cp_kind=usp,ulysses=2,order=cp-tp-dp",
      "dp=2,tp=1,cp=6,cp_kind=usp,ulysses=3,order=dp-tp-cp",
      "dp=2,tp=4,cp=2,order=tp-dp-cp",
  };
}

int64_t world(const Plan& p) { return p.dp * p.tp * p.cp; }

const std::vector<std::pair<Group, const char*>>& kinds() {
  static const std::vector<std::pair<Group, const char*>> k = {{Group::tp, "tp"},   {Group::cp, "cp"},
                                                              {Group::dp, "dp"},   {Group::ulysses, "ulysses"},
                                                              {Group::ring, "ring"}, {Group::zero, "zero"}};
  return k;
}

// The size a group of kind g must have, from the plan's degrees alone.
int64_t expected_size(const Plan& p, Group g) {
  switch (g) {
    case Group::tp: return p.tp;
    case Group::cp: return p.cp;
    case Group::dp: return p.dp;
    case Group::ulysses: return p.cp_comm == CpComm::a2a ? p.cp : p.cp_comm == CpComm::a2a_p2p ? p.ulysses : 1;
    case Group::ring: return p.cp / expected_size(p, Group::ulysses);
    case Group::zero: return p.dp * p.cp;
    case Group::pp:  // (not among kinds(): their groups are checked member by member below)
    case Group::zero_shard:
    case Group::zero_replicate: return -1;
  }
  return 0;
}

std::set<int64_t> as_set(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

}  // namespace

TEST(ProcessGroups, EveryRankInExactlyOneGroupOfEachKind) {
  for (const auto& text : plan_texts()) {
    Plan p = parse_plan(text);
    for (auto [g, name] : kinds()) {
      SCOPED_TRACE(text + " group " + name);
      // Collect the distinct groups; each rank must be counted once over all of them.
      std::set<std::set<int64_t>> groups;
      for (int64_t r = 0; r < world(p); ++r) {
        std::vector<int64_t> mine = group_ranks(p, g, r);
        std::set<int64_t> s = as_set(mine);
        ASSERT_EQ(s.size(), mine.size()) << "duplicate rank in group of rank " << r;
        ASSERT_TRUE(s.count(r)) << "rank " << r << " missing from its own group";
        groups.insert(s);
      }
      std::vector<int> seen(static_cast<size_t>(world(p)), 0);
      for (auto& s : groups)
        for (int64_t r : s) {
          ASSERT_GE(r, 0);
          ASSERT_LT(r, world(p));
          ++seen[static_cast<size_t>(r)];
        }
      for (int64_t r = 0; r < world(p); ++r) EXPECT_EQ(seen[static_cast<size_t>(r)], 1) << "rank " << r;
    }
  }
}

TEST(ProcessGroups, GroupSizesEqualDegrees) {
  for (const auto& text : plan_texts()) {
    Plan p = parse_plan(text);
    for (auto [g, name] : kinds())
      for (int64_t r = 0; r < world(p); ++r)
        EXPECT_EQ(static_cast<int64_t>(group_ranks(p, g, r).size()), expected_size(p, g)) << text << " " << name;
  }
}

TEST(ProcessGroups, TpInnermostMakesRankZerosTpGroupContiguous) {
  for (int64_t tp : {1, 2, 4, 8}) {
    Plan p = parse_plan("dp=2,cp=2,tp=" + std::to_string(tp) + ",order=tp-cp-dp");
    std::vector<int64_t> want;
    for (int64_t i = 0; i < tp; ++i) want.push_back(i);
    EXPECT_EQ(group_ranks(p, Group::tp, 0), want) << tp;
  }
}

TEST(ProcessGroups, DefaultOrderStridesCpByTpAndDpByTpCp) {
  // order tp-cp-dp, tp=2, cp=4, dp=2: rank = tp + 2*cp + 8*dp.
  Plan p = parse_plan("dp=2,tp=2,cp=4");
  EXPECT_EQ(group_ranks(p, Group::cp, 0), (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(group_ranks(p, Group::cp, 1), (std::vector<int64_t>{1, 3, 5, 7}));
  EXPECT_EQ(group_ranks(p, Group::dp, 3), (std::vector<int64_t>{3, 11}));
}

TEST(ProcessGroups, DpInnermostOrderPutsDpRanksNextToEachOther) {
  // order dp-cp-tp, dp=2, cp=2, tp=2: rank = dp + 2*cp + 4*tp.
  Plan p = parse_plan("dp=2,tp=2,cp=2,order=dp-cp-tp");
  EXPECT_EQ(group_ranks(p, Group::dp, 0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(group_ranks(p, Group::cp, 0), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(group_ranks(p, Group::tp, 0), (std::vector<int64_t>{0, 4}));
}

TEST(ProcessGroups, UspUlyssesIsInnermostInsideCp) {
  // tp=2, cp=8 = ring 2 x ulysses 4, order tp-cp-dp: cp index c sits at rank 2*c (for tp 0, dp 0),
  // and c = ring*4 + ulysses. Rank 0's Ulysses group: c = 0..3 -> ranks 0,2,4,6; ring group: c = 0,4 -> 0,8.
  Plan p = parse_plan("dp=2,tp=2,cp=8,cp_kind=usp,ulysses=4");
  EXPECT_EQ(group_ranks(p, Group::ulysses, 0), (std::vector<int64_t>{0, 2, 4, 6}));
  EXPECT_EQ(group_ranks(p, Group::ring, 0), (std::vector<int64_t>{0, 8}));
  // rank 10 = tp 0, cp 5 (ring 1, ulysses 1), dp 0
  RankCoord c = coord_of_rank(p, 10);
  EXPECT_EQ(c.tp, 0);
  EXPECT_EQ(c.cp, 5);
  EXPECT_EQ(c.ring, 1);
  EXPECT_EQ(c.ulysses, 1);
  EXPECT_EQ(c.dp, 0);
}

TEST(ProcessGroups, CoordAndRankAreInverse) {
  for (const auto& text : plan_texts()) {
    Plan p = parse_plan(text);
    int64_t u = expected_size(p, Group::ulysses);
    std::set<std::tuple<int64_t, int64_t, int64_t>> coords;
    for (int64_t r = 0; r < world(p); ++r) {
      RankCoord c = coord_of_rank(p, r);
      EXPECT_EQ(rank_of_coord(p, c), r) << text;
      EXPECT_GE(c.tp, 0);
      EXPECT_LT(c.tp, p.tp);
      EXPECT_GE(c.cp, 0);
      EXPECT_LT(c.cp, p.cp);
      EXPECT_GE(c.dp, 0);
      EXPECT_LT(c.dp, p.dp);
      EXPECT_EQ(c.cp, c.ring * u + c.ulysses) << text;
      EXPECT_LT(c.ulysses, u);
      coords.insert({c.tp, c.cp, c.dp});
    }
    EXPECT_EQ(static_cast<int64_t>(coords.size()), world(p)) << "coords are distinct: " << text;
  }
}

TEST(ProcessGroups, ZeroGroupIsUnionOverDpAndCp) {
  for (const auto& text : plan_texts()) {
    Plan p = parse_plan(text);
    for (int64_t r = 0; r < world(p); ++r) {
      // union over my dp group of each member's cp group
      std::set<int64_t> want;
      for (int64_t d : group_ranks(p, Group::dp, r))
        for (int64_t c : group_ranks(p, Group::cp, d)) want.insert(c);
      EXPECT_EQ(as_set(group_ranks(p, Group::zero, r)), want) << text << " rank " << r;
      // equivalently: every rank holding the same TP shard
      std::set<int64_t> same_tp;
      int64_t my_tp = coord_of_rank(p, r).tp;
      for (int64_t s = 0; s < world(p); ++s)
        if (coord_of_rank(p, s).tp == my_tp) same_tp.insert(s);
      EXPECT_EQ(want, same_tp) << text << " rank " << r;
    }
  }
}

TEST(ProcessGroups, TpEightFitsOneNodeAndTpSixteenSpansTwo) {
  Plan p8 = parse_plan("dp=2,tp=8,cp=1");
  EXPECT_EQ(nodes_spanned(p8, Group::tp, 8), 1);
  Plan p16 = parse_plan("dp=2,tp=16,cp=1");
  EXPECT_EQ(nodes_spanned(p16, Group::tp, 8), 2);
  // With dp innermost, a tp=8 group strides by dp=8: ranks 0, 8, ..., 56 sit on 8 different nodes.
  Plan strided = parse_plan("dp=8,tp=8,cp=1,order=dp-tp-cp");
  EXPECT_EQ(nodes_spanned(strided, Group::tp, 8), 8);
  // And the dp group then sits inside one node.
  EXPECT_EQ(nodes_spanned(strided, Group::dp, 8), 1);
}

// Pipeline stages in the rank grid (process_groups.hpp: pp outermost, Megatron's tp-cp-ep-dp-pp):
// every rank appears once, stage k holds the ranks k*S .. k*S + S - 1 with S = dp*tp*cp (the
// inner grid unchanged inside each stage), and a rank's pp group is {r mod S + k*S, k < pp}.
TEST(ProcessGroups, PipelineStagesAreOutermostAndCoverEveryRankOnce) {
  for (const char* text : {"dp=2,tp=2,cp=2,pp=4", "dp=1,tp=8,cp=1,pp=2", "dp=3,tp=2,cp=2,pp=3,order=cp-dp-tp",
                           "dp=2,tp=1,cp=4,cp_kind=usp,ulysses=2,pp=2,order=dp-tp-cp"}) {
    Plan p = parse_plan(text);
    const int64_t S = p.dp * p.tp * p.cp, W = S * p.pp;
    Plan inner = p;  // the same grid without the pipeline
    inner.pp = 1;
    std::set<int64_t> seen;
    for (int64_t r = 0; r < W; ++r) {
      const RankCoord c = coord_of_rank(p, r);
      EXPECT_EQ(c.pp, r / S) << text << " rank " << r;
      EXPECT_EQ(rank_of_coord(p, c), r) << text;
      // inside a stage the coordinates are those of the plan without pp
      const RankCoord ci = coord_of_rank(inner, r % S);
      EXPECT_TRUE(c.tp == ci.tp && c.cp == ci.cp && c.dp == ci.dp && c.ulysses == ci.ulysses && c.ring == ci.ring) << text << " rank " << r;
      seen.insert(r);
      const std::vector<int64_t> g = group_ranks(p, Group::pp, r);
      ASSERT_EQ(static_cast<int64_t>(g.size()), p.pp) << text;
      for (int64_t k = 0; k < p.pp; ++k) EXPECT_EQ(g[static_cast<size_t>(k)], r % S + k * S) << text << " rank " << r;
      // the inner groups stay inside the rank's stage
      for (Group kind : {Group::tp, Group::cp, Group::dp, Group::zero})
        for (int64_t q : group_ranks(p, kind, r)) EXPECT_EQ(q / S, r / S) << text << " rank " << r;
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), W) << text;
  }
}

// The hot path's count of rank 0's members below a bound (framework_memory: the members on node 0)
// equals counting group_ranks' list, for every plan, group kind (HSDP's two included) and bound.
TEST(ProcessGroups, MembersBelowABoundCountTheListedRanks) {
  std::vector<std::string> texts = plan_texts();
  for (const char* extra : {"dp=4,tp=2,cp=4,zero=3,zero_shard=8", "dp=4,tp=1,cp=8,zero=3,zero_shard=2,order=cp-dp-tp",
                            "dp=8,tp=2,cp=2,zero=3,zero_shard=4,order=dp-tp-cp", "dp=2,tp=2,cp=4,pp=3"})
    texts.push_back(extra);
  int checked = 0;
  for (const std::string& text : texts) {
    const Plan p = parse_plan(text);
    std::vector<std::pair<Group, const char*>> all = kinds();
    all.push_back({Group::zero_shard, "zero_shard"});
    all.push_back({Group::zero_replicate, "zero_replicate"});
    all.push_back({Group::pp, "pp"});
    for (auto [g, name] : all) {
      const std::vector<int64_t> ranks = group_ranks(p, g, 0);
      ASSERT_EQ(group_size(p, g), static_cast<int64_t>(ranks.size())) << text << " " << name;
      for (int64_t bound : {1, 2, 3, 4, 5, 8, 16, 1000}) {
        const auto listed = std::count_if(ranks.begin(), ranks.end(), [bound](int64_t r) { return r < bound; });
        EXPECT_EQ(group_members_below(p, g, bound), listed) << text << " " << name << " below " << bound;
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 16 * 9 * 8);
}

