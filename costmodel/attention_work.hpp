// How much attention work (query-key pairs the mask keeps) each context-parallel rank does, for the
// token placement in cp_placement.hpp (the one the executor runs), under a causal mask with or
// without intra-document masking. Computed exactly from the placement and the document layout.
#pragma once
#include <cstdint>
#include <vector>

#include "costmodel/plan.hpp"

namespace ctx {

// Document lengths laid end to end over one sequence of `seq` tokens (the last one cut at seq).
// fixed: repeated; list: cycled; histogram: a cycle of 100 documents, round(fraction*100) of each
// bin at its upper edge (deterministic). Causal without documents: one document.
std::vector<int64_t> document_layout(const Plan& p, int64_t seq);

// Query-key pairs (k <= q, same document) for queries in [q0, q1) and keys in [k0, k1).
double masked_pairs(int64_t q0, int64_t q1, int64_t k0, int64_t k1, const std::vector<int64_t>& doc_starts);

// Pairs per CP rank (index = position in the CP group) times the fraction of heads the rank holds,
// over the tokens its attention runs on (cp_attention_spans, cp_placement.hpp: ring and allgather
// plain chunks, zigzag pairs, ulysses every token for 1/cp of the heads, usp the ring position's
// zig-zag pair for 1/u of the heads).
std::vector<double> attention_pairs_per_rank(const Plan& p, int64_t seq);

// Attention work per CP rank and ring step, in query-key pairs times the fraction of heads the rank
// holds (so Ulysses ranks, which hold 1/u of the heads over u times the tokens, compare directly):
// out[cp rank][step]. Ring kinds: step j pairs the rank's queries with the keys that arrived from
// the rank j places before it in the ring (plain or zig-zag chunks). allgather: one step with all
// keys. ulysses: one step. usp: ring steps over the ring positions, each pair count divided by u.
std::vector<std::vector<double>> attention_pairs_per_step(const Plan& p, int64_t seq);

// Attention work (query-key pairs) of the sequence each data-parallel rank receives, for `packs`
// packed sequences drawn from the plan's document-length distribution with a fixed seed
// (deterministic). greedy packing fills sequences in arrival order, cutting the last document at
// the boundary; sorted packing (packing=sorted, as GLM-4) places the longest documents first, each
// into the sequence with the least work that has room. Without documents every pack is equal.
std::vector<double> pack_attention_work(const Plan& p, int64_t seq, int64_t packs);

// Work-weighted mean document length (sum l^2 / sum l) of the plan's layout: the length attention
// kernels effectively run at under intra-document masking (seq for a plain causal mask).
double effective_document_length(const Plan& p, int64_t seq);

}  // namespace ctx
