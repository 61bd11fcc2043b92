#include "costmodel/collectives.hpp"

#include <algorithm>
#include <vector>

namespace ctx {

const char* to_string(Coll c) {
  static const char* names[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"};
  return names[static_cast<int>(c)];
}

double bus_factor(Coll c, int64_t n) {
  if (n <= 1) return 0;
  const double nn = static_cast<double>(n);
  switch (c) {
    case Coll::all_reduce: return 2.0 * (nn - 1.0) / nn;
    case Coll::all_gather:
    case Coll::reduce_scatter:
    case Coll::all_to_all: return (nn - 1.0) / nn;
    case Coll::p2p: return 1.0;
  }
  return 1.0;
}

namespace {

// One group's nodes (one entry per member) into `out`: the most nodes a group spans, the fewest
// members a group has on one node (the slowest group sets the pace of a lockstep collective).
void fold_group_nodes(std::vector<int64_t>& nodes, GroupPlacement& out) {
  std::sort(nodes.begin(), nodes.end());
  int64_t distinct = 0;
  for (size_t i = 0; i < nodes.size();) {
    size_t j = i;
    while (j < nodes.size() && nodes[j] == nodes[i]) ++j;
    out.per_node = std::min<int64_t>(out.per_node, static_cast<int64_t>(j - i));
    ++distinct;
    i = j;
  }
  out.nodes = std::max(out.nodes, distinct);
}

// Groups whose members are no product of two axes (an HSDP shard of n ranks that neither divides cp
// nor is a multiple of it): each group listed by group_ranks, the worst one decides (allocates).
GroupPlacement placement_of_listed_groups(const Plan& p, Group g, int64_t gpus_per_node) {
  const int64_t G = std::max<int64_t>(1, gpus_per_node), world = std::max<int64_t>(1, p.dp) * p.tp * p.cp;
  GroupPlacement out;
  out.nodes = 0;
  for (int64_t r = 0; r < world; ++r) {
    const std::vector<int64_t> ranks = group_ranks(p, g, r);
    if (ranks.empty() || ranks.front() != r) continue;  // each group once, from its first member
    std::vector<int64_t> nodes;
    for (int64_t x : ranks) nodes.push_back(x / G);
    out.size = static_cast<int64_t>(ranks.size());
    if (out.nodes == 0) out.per_node = out.size;
    fold_group_nodes(nodes, out);
  }
  out.nodes = std::max<int64_t>(1, out.nodes);
  return out;
}

}  // namespace

GroupPlacement group_placement(const Plan& p, Group g, int64_t gpus_per_node) {
  // strides of each dimension in the rank order (innermost first)
  int64_t stride[3] = {1, 1, 1};  // tp, cp, dp
  int64_t s = 1;
  for (Dim d : p.order) {
    int idx = d == Dim::tp ? 0 : d == Dim::cp ? 1 : 2;
    stride[idx] = s;
    s *= degree_of(p, d);
  }
  const int64_t u = ulysses_degree(p), r = ring_degree(p), dp = std::max<int64_t>(1, p.dp);
  // The group as up to two (count, stride) axes.
  int64_t n1 = 1, s1 = 1, n2 = 1, s2 = 1;
  switch (g) {
    case Group::tp: n1 = p.tp; s1 = stride[0]; break;
    case Group::cp: n1 = p.cp; s1 = stride[1]; break;
    case Group::ulysses: n1 = u; s1 = stride[1]; break;
    case Group::ring: n1 = r; s1 = stride[1] * u; break;
    case Group::dp: n1 = dp; s1 = stride[2]; break;
    case Group::zero: n1 = p.cp; s1 = stride[1]; n2 = dp; s2 = stride[2]; break;
    case Group::pp: n1 = std::max<int64_t>(1, p.pp); s1 = s; break;  // stages outside tp, cp, dp
    case Group::zero_shard:
    case Group::zero_replicate: {
      // blocks of n consecutive zero-group indices k = dp*cp + cp (process_groups.hpp) as axes:
      // n inside cp, or whole cp rows times n/cp dp rows; another n is enumerated
      const int64_t n = zero_shard_degree(p);
      const bool shard = g == Group::zero_shard;
      if (p.cp % n == 0) {
        if (shard) n1 = n, s1 = stride[1];
        else n1 = p.cp / n, s1 = n * stride[1], n2 = dp, s2 = stride[2];
      } else if (n % p.cp == 0) {
        if (shard) n1 = p.cp, s1 = stride[1], n2 = n / p.cp, s2 = stride[2];
        else n1 = dp / (n / p.cp), s1 = n / p.cp * stride[2];
      } else {
        return placement_of_listed_groups(p, g, gpus_per_node);
      }
      break;
    }
  }
  GroupPlacement out;
  out.size = n1 * n2;
  const int64_t G = std::max<int64_t>(1, gpus_per_node);
  // When every axis boundary (stride, stride x count) divides the node size or is a multiple of
  // it, all groups of the kind are congruent modulo nodes and rank 0's group decides (no
  // allocation: the search's hot path). Otherwise (e.g. a degree of 3 on 8-GPU nodes) groups
  // straddle node boundaries unevenly and the slowest one sets the pace of the lockstep
  // collective: the most nodes, the fewest members on one node (the least NIC bandwidth).
  auto aligned = [&](int64_t x) { return x % G == 0 || G % x == 0; };
  if (aligned(s1) && aligned(n1 * s1) && aligned(s2) && aligned(n2 * s2)) {
    int64_t in_node0 = 0;
    for (int64_t b = 0; b < n2 && b * s2 < G; ++b)
      for (int64_t a = 0; a < n1 && b * s2 + a * s1 < G; ++a) ++in_node0;
    out.per_node = std::max<int64_t>(1, in_node0);
    out.nodes = (out.size + out.per_node - 1) / out.per_node;
    return out;
  }
  const int64_t world = dp * p.tp * p.cp;
  std::vector<int64_t> nodes;
  out.nodes = 0;
  out.per_node = out.size;
  for (int64_t leader = 0; leader < world; ++leader) {
    if ((leader / s1) % n1 != 0 || (leader / s2) % n2 != 0) continue;  // not the group's first member
    nodes.clear();
    for (int64_t b = 0; b < n2; ++b)
      for (int64_t a = 0; a < n1; ++a) nodes.push_back((leader + b * s2 + a * s1) / G);
    fold_group_nodes(nodes, out);
  }
  return out;
}

namespace {

double intra_fraction(Coll c, const CollectiveCurves& k) {
  switch (c) {
    case Coll::all_reduce: return k.all_reduce;
    case Coll::all_gather: return k.all_gather;
    case Coll::reduce_scatter: return k.reduce_scatter;
    case Coll::all_to_all: return k.all_to_all;
    case Coll::p2p: return k.p2p;
  }
  return 1.0;
}

}  // namespace

double bus_bandwidth(Coll c, const GroupPlacement& g, const ClusterSpec& cl) {
  const CollectiveCurves& k = cl.gpu.collectives;
  double intra = intra_fraction(c, k) * cl.intra_bytes_per_second;
  if (g.nodes <= 1) return intra;
  const double nic = k.inter_efficiency * cl.inter_bytes_per_second;
  if (c == Coll::p2p) return nic;
  if (c == Coll::all_to_all) {
    // per rank: (per_node-1)/n of the buffer over NVLink, (n-per_node)/n through its own NIC,
    // both at once; expressed as the equivalent busbw for the (n-1)/n bus factor.
    const double n = static_cast<double>(g.size), pn = static_cast<double>(g.per_node);
    double t = std::max((pn - 1.0) / n / intra, (n - pn) / n / nic);
    return (n - 1.0) / n / t;
  }
  // ring collectives across nodes: in-switch reduction (NVLS) does not cross the network
  if (c == Coll::all_reduce) intra = std::min(intra, k.reduce_scatter * cl.intra_bytes_per_second);
  return std::min(intra, static_cast<double>(g.per_node) * nic);
}

double collective_seconds(Coll c, double bytes, const GroupPlacement& g, const ClusterSpec& cl) {
  if (g.size <= 1 || bytes <= 0) return 0;
  const CollectiveCurves& k = cl.gpu.collectives;
  const double n = static_cast<double>(g.size);
  // algorithm steps: ring all-reduce 2(n-1), all-gather / reduce-scatter n-1, all-to-all and p2p 1;
  // the node-crossing share of the steps pays the network latency.
  double steps = c == Coll::all_reduce ? 2.0 * (n - 1.0) : (c == Coll::all_to_all || c == Coll::p2p) ? 1.0 : n - 1.0;
  double cross = g.nodes <= 1 ? 0.0 : (c == Coll::all_reduce ? 2.0 : 1.0) * static_cast<double>(g.nodes - 1);
  if (c == Coll::all_to_all || c == Coll::p2p) cross = g.nodes > 1 ? 1.0 : 0.0;
  cross = std::min(cross, steps);
  double latency = (steps - cross) * cl.intra_latency_seconds + cross * cl.inter_latency_seconds;
  return k.launch_seconds + latency + bytes * bus_factor(c, g.size) / bus_bandwidth(c, g, cl);
}

double inter_node_bytes_per_rank(Coll c, double bytes, const GroupPlacement& g) {
  if (g.nodes <= 1 || g.size <= 1 || bytes <= 0) return 0;
  const double n = static_cast<double>(g.size), pn = static_cast<double>(g.per_node);
  if (c == Coll::p2p) return bytes;
  if (c == Coll::all_to_all) return bytes * (n - pn) / n;
  return bytes * bus_factor(c, g.size) / pn;
}

double pcie_seconds(double bytes, const ClusterSpec& cl) {
  if (bytes <= 0) return 0;
  return 5e-6 + bytes / cl.gpu.pcie_bytes_per_second;
}

}  // namespace ctx
