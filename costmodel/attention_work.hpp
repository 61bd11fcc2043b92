// How much attention work (query-key pairs the mask keeps) each context-parallel rank does, for the
// token placement in cp_placement.hpp (the one the executor runs), under a causal mask with or
// without intra-document masking. Computed exactly from the placement and the document layout.
#pragma once
#include <cstdint>
#include <vector>

#include "costmodel/plan.hpp"

namespace ctx {

// Document lengths laid end to end over one sequence of `seq` tokens (the last one cut at seq).
// fixed: repeated; list: cycled; histogram: the first of priced_packs (deterministic).
// Causal without documents: one document.
std::vector<int64_t> document_layout(const Plan& p, int64_t seq);

// `packs` sequences of `seq` tokens packed from documents drawn from the plan's distribution with a
// fixed seed (deterministic): each pack's document lengths in order. Histogram bins draw lengths
// uniformly over (previous edge, edge], with the bin's share of documents (doc:hist) or of tokens
// (doc:tokhist, converted by the bin's mean length). greedy packing fills sequences in arrival
// order, cutting the last document at the boundary (its rest starts the next pack); sorted packing
// (packing=sorted, as GLM-4) places the longest documents first, each into the pack with the least
// work that has room. fixed lengths: every pack is document_layout.
std::vector<std::vector<int64_t>> sample_packs(const Plan& p, int64_t seq, int64_t packs);

// The packs per-rank attention work is priced on: for a histogram, kPricedPacks packs from
// sample_packs in arrival order (greedy, whatever the plan's packing: the work is their mean, an
// expectation over packs that represent the histogram); otherwise the one document_layout.
constexpr int64_t kPricedPacks = 16;
std::vector<std::vector<int64_t>> priced_packs(const Plan& p, int64_t seq);

// Query-key pairs (k <= q, same document) for queries in [q0, q1) and keys in [k0, k1).
double masked_pairs(int64_t q0, int64_t q1, int64_t k0, int64_t k1, const std::vector<int64_t>& doc_starts);

// Pairs per CP rank (index = position in the CP group) times the fraction of heads the rank holds,
// over the tokens its attention runs on (cp_attention_spans, cp_placement.hpp: the layout's spans for
// p2p and allgather, every token for 1/cp of the heads under a2a, the ring position's spans for 1/u
// of the heads under a2a+p2p), for one pack of documents, or the mean over priced_packs.
std::vector<double> attention_pairs_per_rank(const Plan& p, const std::vector<int64_t>& doc_lengths);
std::vector<double> attention_pairs_per_rank(const Plan& p, int64_t seq);

// Attention work per CP rank and ring step, in query-key pairs times the fraction of heads the rank
// holds (so Ulysses ranks, which hold 1/u of the heads over u times the tokens, compare directly):
// out[cp rank][step]. Ring exchanges: step j pairs the rank's queries with the keys that arrived
// from the rank j places before it in the ring. allgather: one step with all keys. a2a: one step.
// a2a+p2p: ring steps over the ring positions, each pair count divided by u. For one pack of
// documents, or the mean over priced_packs.
std::vector<std::vector<double>> attention_pairs_per_step(const Plan& p, const std::vector<int64_t>& doc_lengths);
std::vector<std::vector<double>> attention_pairs_per_step(const Plan& p, int64_t seq);

// Pairs of each CP rank's queries with its own keys under a plain causal mask (one document of
// `seq` tokens), times the fraction of heads the rank holds: out[cp rank]. This is a ring's step 0,
// the one block a causal mask cuts; the other ranks' keys arrive as blocks every query of the rank
// sees whole or not at all (cp_placement.hpp's layouts never split a key block across the diagonal
// outside the rank's own spans). O(cp), without the rank x rank matrix.
std::vector<double> attention_pairs_own_keys(const Plan& p, int64_t seq);

// Attention work (query-key pairs) of the sequence each data-parallel rank receives: the packs of
// sample_packs(p, seq, packs). Without documents every pack is equal.
std::vector<double> pack_attention_work(const Plan& p, int64_t seq, int64_t packs);

// Work-weighted mean document length (sum l^2 / sum l) over priced_packs: the length attention
// kernels effectively run at under intra-document masking (seq for a plain causal mask).
double effective_document_length(const Plan& p, int64_t seq);

// The attention kernel calls a CP rank makes per layer under a variable-length strategy
// (cp_varlen, plan.hpp) on a ring exchange with a document mask: `count` calls per micro-batch (the
// mean over priced_packs), each pairing pairs[cp rank][step] query-key pairs (one entry per rank
// when !per_step), run at the attention curve's efficiency for `tokens` queries, and moving
// `kv_share` of the pack's per-step K,V block per ring hop.
//   cycle:   the ring is run once per document, its document cut over the ranks by the layout
//            (contiguous, else head-tail within the document): one call per document and step at
//            the efficiency of the document's block (its length / ring degree); lengths within
//            2^(1/8) of each other share one entry (pairs and hop bytes summed exactly)
//   split:k: the pack's documents dealt round-robin into k sub-packs (document i to sub-pack
//            i mod k), each placed by the plan's layout and run as one native varlen ring
// Empty for native (one varlen call per step over the whole pack: attention_pairs_per_step) and
// wherever the strategy does not apply (no document mask, no ring, cp = 1).
struct AttentionCall {
  double count = 1;
  double tokens = 0;
  double kv_share = 1;
  std::vector<std::vector<double>> pairs;
};
std::vector<AttentionCall> varlen_calls(const Plan& p, int64_t seq, bool per_step);

// Native varlen's padded softmax statistics: flash-attn 2's varlen kernels return the LSE as
// [documents, heads, longest document] (ring-flash-attention utils.py, flatten_varlen_lse /
// unflatten_varlen_lse, pads and unpads it every step), so a rank holding pieces of D documents, the
// longest Lmax tokens, over T tokens keeps D*Lmax - T padded query rows per LSE buffer. The largest
// over the ranks, the sub-packs of split:k and the priced packs; 0 for cycle (one document per call)
// and where cp_varlen does not apply.
double varlen_padded_lse_rows(const Plan& p, int64_t seq);

}  // namespace ctx
