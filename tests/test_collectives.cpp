// Collectives priced the nccl-tests way: the bus factors, where a group's ranks sit (against a
// brute-force count over the real process groups), monotonicity, the slower inter-node link, and
// the model against a measured all-reduce sweep on 8x H200 (profiles/validation/collectives.jsonl).
#include <gtest/gtest.h>

#include <array>

#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "costmodel/collectives.hpp"
#include "costmodel/process_groups.hpp"
#include "costmodel/profile_store.hpp"
#include "validation_data.hpp"

namespace ctx {
namespace {

const Profiles& profiles() {
  static Profiles p = load_profiles(default_profiles_dir());
  return p;
}

TEST(Collectives, BusFactorsAreNcclTestsConventions) {
  for (int64_t n : {2, 3, 4, 8, 16, 64, 1024}) {
    const double nn = static_cast<double>(n);
    EXPECT_DOUBLE_EQ(bus_factor(Coll::all_reduce, n), 2.0 * (nn - 1) / nn) << n;
    EXPECT_DOUBLE_EQ(bus_factor(Coll::all_gather, n), (nn - 1) / nn) << n;
    EXPECT_DOUBLE_EQ(bus_factor(Coll::reduce_scatter, n), (nn - 1) / nn) << n;
    EXPECT_DOUBLE_EQ(bus_factor(Coll::all_to_all, n), (nn - 1) / nn) << n;
    EXPECT_DOUBLE_EQ(bus_factor(Coll::p2p, n), 1.0) << n;
  }
  for (Coll c : {Coll::all_reduce, Coll::all_gather, Coll::reduce_scatter, Coll::all_to_all, Coll::p2p}) {
    EXPECT_EQ(bus_factor(c, 1), 0.0) << to_string(c);  // a group of one moves nothing
  }
  // 8 ranks: the textbook numbers
  EXPECT_DOUBLE_EQ(bus_factor(Coll::all_reduce, 8), 1.75);
  EXPECT_DOUBLE_EQ(bus_factor(Coll::all_gather, 8), 0.875);
}

// Brute force over every group of a kind, from group_ranks: the size, the most nodes any group
// spans, and the fewest members any group has on one of its nodes (the bottleneck NIC count).
struct Brute {
  int64_t size = 0, nodes = 0, min_per_node = 1 << 30, max_per_node = 0;
};
Brute brute_placement(const Plan& p, Group g, int64_t gpn) {
  Brute b;
  const int64_t world = p.dp * p.cp * p.tp;
  for (int64_t r = 0; r < world; ++r) {
    std::vector<int64_t> ranks = group_ranks(p, g, r);
    std::map<int64_t, int64_t> per_node;
    for (int64_t x : ranks) ++per_node[x / gpn];
    b.size = static_cast<int64_t>(ranks.size());
    b.nodes = std::max(b.nodes, static_cast<int64_t>(per_node.size()));
    for (auto& [node, n] : per_node) {
      b.min_per_node = std::min(b.min_per_node, n);
      b.max_per_node = std::max(b.max_per_node, n);
    }
  }
  return b;
}

Plan layout(int64_t dp, int64_t tp, int64_t cp, CpKind kind, int64_t u, Dim o0, Dim o1, Dim o2) {
  Plan p;
  p.dp = dp;
  p.tp = tp;
  p.cp = cp;
  set_cp_kind(p, kind);
  p.ulysses = u;
  p.order[0] = o0;
  p.order[1] = o1;
  p.order[2] = o2;
  return p;
}

TEST(Collectives, GroupPlacementMatchesBruteForceOverProcessGroups) {
  // power-of-two degrees and node sizes: groups of one kind are congruent, so the placement of
  // rank 0's group (what the hot path computes without allocating) is every group's
  const Dim orders[6][3] = {{Dim::tp, Dim::cp, Dim::dp}, {Dim::tp, Dim::dp, Dim::cp}, {Dim::cp, Dim::tp, Dim::dp},
                            {Dim::cp, Dim::dp, Dim::tp}, {Dim::dp, Dim::tp, Dim::cp}, {Dim::dp, Dim::cp, Dim::tp}};
  int checked = 0;
  for (int64_t world : {8, 16, 64}) {
    for (int64_t tp = 1; tp <= 8; tp *= 2) {
      for (int64_t cp = 1; tp * cp <= world; cp *= 2) {
        const int64_t dp = world / (tp * cp);
        std::vector<std::pair<CpKind, int64_t>> kinds = {{CpKind::zigzag, 0}};
        if (cp >= 4) kinds.push_back({CpKind::usp, 2});
        if (cp >= 2) kinds.push_back({CpKind::ulysses, 0});
        for (auto [kind, u] : kinds) {
          for (auto& o : orders) {
            Plan p = layout(dp, tp, cp, kind, u, o[0], o[1], o[2]);
            for (int64_t gpn : {1, 2, 4, 8}) {
              for (Group g : {Group::tp, Group::cp, Group::dp, Group::ulysses, Group::ring, Group::zero}) {
                GroupPlacement gp = group_placement(p, g, gpn);
                Brute b = brute_placement(p, g, gpn);
                std::string what = "world " + std::to_string(world) + " gpn " + std::to_string(gpn) + " " + plan_to_string(p) +
                                   " order " + order_to_string(p) + " group " + std::to_string(static_cast<int>(g));
                ASSERT_EQ(gp.size, b.size) << what;
                EXPECT_EQ(gp.nodes, b.nodes) << what;
                EXPECT_EQ(gp.per_node, b.min_per_node) << what;
                EXPECT_EQ(b.min_per_node, b.max_per_node) << what << " (groups not congruent)";
                EXPECT_EQ(gp.nodes, nodes_spanned(p, g, gpn)) << what;
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 2000);
}

TEST(Collectives, GroupPlacementOnUnevenLayoutsIsTheWorstGroup) {
  // A 3-way degree on 8-GPU nodes (24 GPUs, e.g. `maxseq --gpus 24`) leaves groups that straddle
  // node boundaries unevenly. Collectives of one kind run in lockstep, so the placement that
  // prices them is the worst group's: the most nodes, the fewest members on one node.
  for (auto [dp, tp, cp] : {std::tuple<int64_t, int64_t, int64_t>{8, 1, 3}, {3, 8, 1}, {4, 2, 3}, {2, 4, 3}, {6, 4, 1}, {1, 8, 3}}) {
    for (auto order : {std::array<Dim, 3>{Dim::tp, Dim::cp, Dim::dp}, std::array<Dim, 3>{Dim::tp, Dim::dp, Dim::cp}}) {
      Plan p = layout(dp, tp, cp, CpKind::ring, 0, order[0], order[1], order[2]);
      for (Group g : {Group::tp, Group::cp, Group::dp, Group::zero}) {
        GroupPlacement gp = group_placement(p, g, 8);
        Brute b = brute_placement(p, g, 8);
        EXPECT_EQ(gp.size, b.size);
        EXPECT_EQ(gp.nodes, b.nodes) << plan_to_string(p) << " group " << static_cast<int>(g);
        EXPECT_EQ(gp.per_node, b.min_per_node) << plan_to_string(p) << " group " << static_cast<int>(g);
      }
    }
  }
}

TEST(Collectives, TimeGrowsWithBytesAndRanks) {
  ClusterSpec c = resolve_cluster(profiles(), "8x8xh100");
  for (Coll coll : {Coll::all_reduce, Coll::all_gather, Coll::reduce_scatter, Coll::all_to_all, Coll::p2p}) {
    // bytes, inside one node
    double prev = 0;
    for (double bytes = 1024; bytes <= 16.0 * (1 << 30); bytes *= 4) {
      double t = collective_seconds(coll, bytes, GroupPlacement{8, 1, 8}, c);
      EXPECT_GT(t, prev) << to_string(coll) << " " << bytes;
      prev = t;
    }
    // ranks: more members of the same message never take less time (within a node, then across nodes)
    for (double bytes : {1e6, 1e9}) {
      double prev_n = 0;
      for (GroupPlacement g : {GroupPlacement{2, 1, 2}, GroupPlacement{4, 1, 4}, GroupPlacement{8, 1, 8}, GroupPlacement{16, 2, 8},
                               GroupPlacement{32, 4, 8}, GroupPlacement{64, 8, 8}}) {
        double t = collective_seconds(coll, bytes, g, c);
        EXPECT_GE(t, prev_n) << to_string(coll) << " n=" << g.size << " bytes " << bytes;
        prev_n = t;
      }
    }
  }
  EXPECT_EQ(collective_seconds(Coll::all_reduce, 1e9, GroupPlacement{1, 1, 1}, c), 0.0);
  EXPECT_EQ(collective_seconds(Coll::all_reduce, 0, GroupPlacement{8, 1, 8}, c), 0.0);
}

TEST(Collectives, GroupSpanningNodesIsSlower) {
  ClusterSpec c = resolve_cluster(profiles(), "8x8xh100");
  for (Coll coll : {Coll::all_reduce, Coll::all_gather, Coll::reduce_scatter, Coll::all_to_all, Coll::p2p}) {
    for (double bytes : {1e5, 1e7, 1e9}) {
      // the same 8 ranks, in one node vs one per node (dp outermost with tp=8: stride 8)
      double inside = collective_seconds(coll, bytes, GroupPlacement{8, 1, 8}, c);
      double spread = collective_seconds(coll, bytes, GroupPlacement{8, 8, 1}, c);
      double two_nodes = collective_seconds(coll, bytes, GroupPlacement{8, 2, 4}, c);
      EXPECT_GT(spread, inside) << to_string(coll) << " " << bytes;
      EXPECT_GT(two_nodes, inside) << to_string(coll) << " " << bytes;
      EXPECT_GE(spread, two_nodes) << to_string(coll) << " " << bytes;
    }
    // large messages: across nodes the bus bandwidth is the NICs', not NVLink's
    EXPECT_LT(bus_bandwidth(coll, GroupPlacement{8, 8, 1}, c), bus_bandwidth(coll, GroupPlacement{8, 1, 8}, c)) << to_string(coll);
    EXPECT_LE(bus_bandwidth(coll, GroupPlacement{8, 8, 1}, c), c.inter_bytes_per_second) << to_string(coll);
  }
  // and the placement comes from the plan: tp=8 innermost keeps TP inside a node, dp across
  Plan p = layout(8, 8, 1, CpKind::zigzag, 0, Dim::tp, Dim::cp, Dim::dp);
  EXPECT_EQ(group_placement(p, Group::tp, 8).nodes, 1);
  EXPECT_EQ(group_placement(p, Group::dp, 8).nodes, 8);
  EXPECT_GT(collective_seconds(Coll::all_reduce, 1e8, group_placement(p, Group::dp, 8), c),
            collective_seconds(Coll::all_reduce, 1e8, group_placement(p, Group::tp, 8), c));
}

// The alpha-beta model (launch + latency x steps + bytes x factor / busbw) against nccl-tests-style
// all-reduce busbw measured on 8x H200 (stas00/ml-engineering; points copied with their source
// into profiles/validation/collectives.jsonl; GB/s = 1e9 bytes/s). Measured error of the model on
// this commit's H200 profile, busbw predicted vs published:
//   1 MiB -5.9%, 4 MiB +13.6%, 16 MiB +25.8%, 64 MiB +17.0%, 256 MiB +5.2%, 1 GiB +2.4%, 4 GiB +1.2%, 16 GiB -0.5%
// The model has one latency and one bandwidth per link, so it cannot bend like NCCL's protocol
// switches (LL/LL128/Simple) and the NVLS ramp: it is optimistic at mid sizes (worst +26% at
// 16 MiB) and within 3% from 1 GiB up. Tolerances: 3% from 1 GiB up; 30% below (about the worst
// measured; tightening needs the profiles to carry a size curve, which calibration can write).
TEST(Collectives, AllReduceMatchesMeasuredSweepOn8xH200) {
  auto points = test::read_jsonl("collectives.jsonl");
  ASSERT_GE(points.size(), 8u);
  ClusterSpec c = resolve_cluster(profiles(), "dgx-h200");
  int compared = 0;
  double prev_model = 0, prev_meas = 0;
  std::string table;
  for (const json& pt : points) {
    if (pt.at("collective") != "all_reduce" || pt.at("gpu") != c.gpu.name) continue;
    const int64_t n = pt.at("ranks").get<int64_t>();
    ASSERT_EQ(n, 8);
    const double bytes = pt.at("size_bytes").get<double>();
    const double measured = pt.at("busbw_gbps").get<double>() * 1e9;
    const double t = collective_seconds(Coll::all_reduce, bytes, GroupPlacement{n, 1, n}, c);
    const double model = bytes * 2.0 * (n - 1.0) / static_cast<double>(n) / t;
    const double err = (model - measured) / measured;
    char line[160];
    std::snprintf(line, sizeof line, "  %-28s %12.0f B  model %7.1f GB/s  measured %7.1f GB/s  %+6.1f%%\n",
                  pt.at("id").get<std::string>().c_str(), bytes, model / 1e9, measured / 1e9, 100 * err);
    table += line;
    const double tol = bytes >= static_cast<double>(1 << 30) ? 0.03 : 0.30;
    EXPECT_LT(std::abs(err), tol) << pt.at("id") << ": model " << model / 1e9 << " GB/s vs measured " << measured / 1e9;
    // both rise with the message size
    EXPECT_GT(model, prev_model) << pt.at("id");
    EXPECT_GT(measured, prev_meas) << pt.at("id");
    prev_model = model;
    prev_meas = measured;
    ++compared;
  }
  EXPECT_EQ(compared, 8);
  std::printf("all-reduce busbw, 8x H200:\n%s", table.c_str());
}

}  // namespace
}  // namespace ctx
