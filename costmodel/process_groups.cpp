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

int64_t group_size(const Plan& p, Group g) {
  switch (g) {
    case Group::tp: return p.tp;
    case Group::cp: return p.cp;
    case Group::ulysses: return ulysses_degree(p);
    case Group::ring: return ring_degree(p);
    case Group::dp: return p.dp;
    case Group::pp: return p.pp;
    case Group::zero: return p.dp * p.cp;
    case Group::zero_shard: return zero_shard_degree(p);
    case Group::zero_replicate: return zero_replicate_degree(p);
  }
  return 1;
}

int64_t group_member(const Plan& p, Group g, int64_t rank, int64_t i) {
  const RankCoord me = rank == 0 ? RankCoord{} : coord_of_rank(p, rank);  // rank 0: every coordinate 0
  const int64_t u = ulysses_degree(p);
  RankCoord c = me;
  auto set_cp = [&](int64_t k) { c.ring = k / u, c.ulysses = k % u; };  // the CP index, Ulysses innermost
  switch (g) {
    case Group::tp: c.tp = i; break;
    case Group::cp: set_cp(i); break;
    case Group::ulysses: c.ulysses = i; break;
    case Group::ring: c.ring = i; break;
    case Group::dp: c.dp = i; break;
    case Group::pp: c.pp = i; break;
    case Group::zero: c.dp = i / p.cp; set_cp(i % p.cp); break;  // dp outer, cp inner
    case Group::zero_shard:
    case Group::zero_replicate: {
      const int64_t n = zero_shard_degree(p), k_me = me.dp * p.cp + me.cp;
      const int64_t k = g == Group::zero_shard ? k_me / n * n + i : k_me % n + i * n;
      c.dp = k / p.cp;
      set_cp(k % p.cp);
      break;
    }
  }
  c.cp = c.ring * u + c.ulysses;
  return rank_of_coord(p, c);
}

int64_t group_members_below(const Plan& p, Group g, int64_t bound) {
  // rank_of_coord is mixed radix: a coordinate's stride is the product of the degrees inside it
  auto stride = [&p](Dim d) {
    int64_t s = 1;
    for (Dim e : p.order) {
      if (e == d) return s;
      s *= degree_of(p, e);
    }
    return s;
  };
  // rank 0's members: index k = start + j * step (j < count) splits into an outer coordinate k / inner
  // and an inner one k % inner; member = (k / inner) * s_outer + (k % inner) * s_inner
  int64_t start = 0, step = 1, count = group_size(p, g), inner = std::max<int64_t>(1, count), s_outer = 0, s_inner = 1;
  switch (g) {
    case Group::tp: s_inner = stride(Dim::tp); break;
    case Group::cp:
    case Group::ulysses: s_inner = stride(Dim::cp); break;  // Ulysses innermost in the CP index
    case Group::ring: s_inner = ulysses_degree(p) * stride(Dim::cp); break;
    case Group::dp: s_inner = stride(Dim::dp); break;
    case Group::pp: s_inner = p.tp * p.cp * p.dp; break;   // the stage outside the three inner dimensions
    case Group::zero:
    case Group::zero_shard:
    case Group::zero_replicate:                           // k = dp * cp + cp (group_member)
      inner = std::max<int64_t>(1, p.cp), s_outer = stride(Dim::dp), s_inner = stride(Dim::cp);
      if (g == Group::zero_replicate) step = zero_shard_degree(p);
      break;
  }
  int64_t below = 0;
  for (int64_t j = 0; j < count;) {
    const int64_t k = start + j * step, outer = k / inner;
    if (outer * s_outer >= bound) break;  // k only grows, and with it the outer coordinate
    if (outer * s_outer + (k % inner) * s_inner < bound) {
      ++below;
      ++j;
    } else {  // the rest of this outer row is above the bound too: on to the next row's first index
      const int64_t next_k = (outer + 1) * inner;
      j = (next_k - start + step - 1) / step;
    }
  }
  return below;
}

std::vector<int64_t> group_ranks(const Plan& p, Group g, int64_t rank) {
  const int64_t n = group_size(p, g);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = group_member(p, g, rank, i);
  return out;
}

int64_t nodes_spanned(const Plan& p, Group g, int64_t gpus_per_node) {
  std::set<int64_t> nodes;
  for (int64_t r : group_ranks(p, g, 0)) nodes.insert(r / gpus_per_node);
  return static_cast<int64_t>(nodes.size());
}

}  // namespace ctx
