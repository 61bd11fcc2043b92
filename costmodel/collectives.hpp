// Collectives priced the way nccl-tests reports them. For a message of `bytes` (nccl-tests'
// "size") over n ranks, the bus carries bytes * factor, where factor = 2(n-1)/n for all-reduce,
// (n-1)/n for all-gather, reduce-scatter and all-to-all, and 1 for point-to-point; time =
// launch + latency * algorithm steps + bytes * factor / busbw. Bus bandwidth inside a node is a
// measured fraction of the NVLink rate (profiles/hardware "collectives"). A group spanning nodes is
// priced hierarchically on the slower link: its ring crosses each node boundary once per channel,
// with one NIC per member GPU on that node, so busbw = min(intra busbw, members per node x NIC rate);
// all-to-all sends the off-node share of each rank's buffer through that rank's NIC.
#pragma once
#include <cstdint>

#include "costmodel/hardware_spec.hpp"
#include "costmodel/plan.hpp"
#include "costmodel/process_groups.hpp"

namespace ctx {

enum class Coll { all_reduce, all_gather, reduce_scatter, all_to_all, p2p };
const char* to_string(Coll c);

// Bytes on the bus per byte of message (nccl-tests' busbw / algbw).
double bus_factor(Coll c, int64_t n);

// Where one group of a kind sits: its size, nodes spanned, and members per node.
struct GroupPlacement {
  int64_t size = 1;
  int64_t nodes = 1;
  int64_t per_node = 1;
};
// Where groups of one kind are congruent modulo nodes (power-of-two layouts), rank 0's decides and
// nothing is allocated (hot path of the search); on uneven layouts, the worst group.
GroupPlacement group_placement(const Plan& p, Group g, int64_t gpus_per_node);

// Seconds for one collective of `bytes` on a group placed as `g`.
double collective_seconds(Coll c, double bytes, const GroupPlacement& g, const ClusterSpec& cl);
// Bus bandwidth (bytes/s) the model uses for a large message (for reports and tests).
double bus_bandwidth(Coll c, const GroupPlacement& g, const ClusterSpec& cl);

// Bytes one rank's share of one collective of `bytes` sends between nodes: 0 inside a node; across
// nodes a ring crosses every node boundary, so a node's NICs carry the bus bytes (bytes x bus_factor)
// shared by its per_node members (the hierarchical model above); all-to-all: the off-node share.
double inter_node_bytes_per_rank(Coll c, double bytes, const GroupPlacement& g);

// Seconds for a host<->device copy of `bytes` over PCIe (pinned memory).
double pcie_seconds(double bytes, const ClusterSpec& cl);

}  // namespace ctx
