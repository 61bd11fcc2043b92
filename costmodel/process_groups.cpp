#include "costmodel/process_groups.hpp"

#include <set>

namespace ctx {

int64_t degree_of(const Plan& p, Dim d) {
  switch (d) {
    case Dim::tp: return p.tp;
    case Dim::cp: return p.cp;
    case Dim::dp: return p.dp;
  }
  return 1;
}

RankCoord coord_of_rank(const Plan& p, int64_t rank) {
  RankCoord c;
  int64_t rest = rank;
  for (Dim d : p.order) {
    int64_t n = degree_of(p, d);
    int64_t idx = rest % n;
    rest /= n;
    if (d == Dim::tp) c.tp = idx;
    else if (d == Dim::cp) c.cp = idx;
    else c.dp = idx;
  }
  c.pp = rest % std::max<int64_t>(1, p.pp);  // the stage, outside the three inner dimensions
  int64_t u = ulysses_degree(p);
  c.ulysses = c.cp % u;
  c.ring = c.cp / u;
  return c;
}

int64_t rank_of_coord(const Plan& p, const RankCoord& c) {
  int64_t rank = 0, stride = 1;
  for (Dim d : p.order) {
    int64_t idx = d == Dim::tp ? c.tp : d == Dim::cp ? c.cp : c.dp;
    rank += idx * stride;
    stride *= degree_of(p, d);
  }
  return rank + c.pp * stride;
}

std::vector<int64_t> group_ranks(const Plan& p, Group g, int64_t rank) {
  RankCoord me = coord_of_rank(p, rank);
  int64_t u = ulysses_degree(p), r = ring_degree(p);
  std::vector<int64_t> out;
  auto push = [&](RankCoord c) {
    c.cp = c.ring * u + c.ulysses;
    out.push_back(rank_of_coord(p, c));
  };
  RankCoord c = me;
  switch (g) {
    case Group::tp:
      for (int64_t i = 0; i < p.tp; ++i) { c.tp = i; push(c); }
      break;
    case Group::cp:
      for (int64_t i = 0; i < p.cp; ++i) { c.ring = i / u; c.ulysses = i % u; push(c); }
      break;
    case Group::ulysses:
      for (int64_t i = 0; i < u; ++i) { c.ulysses = i; push(c); }
      break;
    case Group::ring:
      for (int64_t i = 0; i < r; ++i) { c.ring = i; push(c); }
      break;
    case Group::dp:
      for (int64_t i = 0; i < p.dp; ++i) { c.dp = i; push(c); }
      break;
    case Group::pp:
      for (int64_t i = 0; i < p.pp; ++i) { c.pp = i; push(c); }
      break;
    case Group::zero:
      for (int64_t d = 0; d < p.dp; ++d)
        for (int64_t i = 0; i < p.cp; ++i) { c.dp = d; c.ring = i / u; c.ulysses = i % u; push(c); }
      break;
    case Group::zero_shard:
    case Group::zero_replicate: {
      const int64_t n = zero_shard_degree(p), k_me = me.dp * p.cp + me.cp;
      const int64_t first = g == Group::zero_shard ? k_me / n * n : k_me % n;
      const int64_t count = g == Group::zero_shard ? n : zero_replicate_degree(p);
      const int64_t step = g == Group::zero_shard ? 1 : n;
      for (int64_t j = 0; j < count; ++j) {
        const int64_t k = first + j * step;
        c.dp = k / p.cp;
        c.ring = k % p.cp / u;
        c.ulysses = k % p.cp % u;
        push(c);
      }
      break;
    }
  }
  return out;
}

int64_t nodes_spanned(const Plan& p, Group g, int64_t gpus_per_node) {
  std::set<int64_t> nodes;
  for (int64_t r : group_ranks(p, g, 0)) nodes.insert(r / gpus_per_node);
  return static_cast<int64_t>(nodes.size());
}

}  // namespace ctx
