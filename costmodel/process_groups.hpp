// Which global ranks form each process group, from the plan's degrees and rank order.
// One pure function shared by the cost model (placement of collectives) and the executor
// (creating communicators), so predicted and real groups are the same. The pipeline stage is the
// outermost coordinate (Megatron's default order tp-cp-ep-dp-pp, parallel_state.initialize_model_parallel):
// rank = ((inner coordinates in p.order) ) + stage * dp*tp*cp.
#pragma once
#include <cstdint>
#include <vector>

#include "costmodel/plan.hpp"

namespace ctx {

struct RankCoord {
  int64_t tp = 0, cp = 0, dp = 0;
  int64_t pp = 0;                 // pipeline stage
  int64_t ulysses = 0, ring = 0;  // cp = ring * ulysses_degree + ulysses (Ulysses innermost in cp)
};

int64_t degree_of(const Plan& p, Dim d);
RankCoord coord_of_rank(const Plan& p, int64_t rank);
int64_t rank_of_coord(const Plan& p, const RankCoord& c);

// zero: the dp x cp ranks of one TP shard, indexed k = dp * cp + cp (cp innermost, as Megatron's
// dp-cp group in its tp-cp-dp order). HSDP (plan key zero_shard = n) cuts that index into blocks:
// zero_shard = the n consecutive k that shard the model states (one node when n*tp <= GPUs per node
// in the default order), zero_replicate = the dp*cp/n ranks with the same k mod n (same shard).
// Without HSDP zero_shard is the zero group and zero_replicate is the rank alone.
enum class Group { tp, cp, dp, ulysses, ring, zero /* dp x cp */, pp /* one rank per stage */, zero_shard, zero_replicate };
// The global ranks in `rank`'s group of kind `g`, ordered by their index inside the group.
std::vector<int64_t> group_ranks(const Plan& p, Group g, int64_t rank);
// The same without building the list, for hot paths (predict_memory allocates nothing): the
// group's size, and its member at index i (0 <= i < size): group_ranks(p, g, rank)[i].
int64_t group_size(const Plan& p, Group g);
int64_t group_member(const Plan& p, Group g, int64_t rank, int64_t i);
// How many members of rank 0's group of kind g have a rank below `bound` (e.g. sit on node 0: bound
// = GPUs per node), counted without visiting the members above it: the ranks are mixed-radix sums of
// the group's coordinates, so the count takes at most about 2 x bound steps.
int64_t group_members_below(const Plan& p, Group g, int64_t bound);
// Number of distinct nodes one group of kind `g` spans (groups of one kind are congruent).
int64_t nodes_spanned(const Plan& p, Group g, int64_t gpus_per_node);

}  // namespace ctx
