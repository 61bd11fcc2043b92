// Where a context-parallel rank's tokens sit in the sequence: the one placement the cost model
// prices (attention_work.cpp) and the executor runs (executor/context_parallel.cpp), from the plan's
// cp_layout (plan.hpp). A layout places `positions` places over a run of tokens:
//   contiguous:   place i holds chunk i of `positions` equal chunks
//   headtail:     place i holds chunks i and 2*positions-1-i of 2*positions (balances causal work)
//   headtail-doc: every document is cut into 2*positions chunks and place i holds chunks i and
//                 2*positions-1-i of each, document by document (Transformer Engine's THD layout:
//                 thd_get_partitioned_indices / get_cu_seqlens_on_cp_rank, context_parallel.py)
// The places are the CP ranks for p2p and allgather, the ring positions for a2a+p2p (each ring
// position's tokens then cut into `ulysses` equal slices, slice c % u on CP index c), and the CP
// ranks for a2a (Ulysses gathers the whole sequence for attention, so the layout changes only which
// tokens the rank's other layers see).
// Chunks of a run of n tokens cut in k: chunk j is [floor(n*j/k), floor(n*(j+1)/k)); when n divides
// by k every chunk is equal (check_plan asks for that of the sequence; TE pads each document to a
// multiple of 2*cp, which the cost model prices as the unpadded cut).
#pragma once
#include <cstdint>
#include <vector>

#include "costmodel/plan.hpp"

namespace ctx {

// Tokens [begin, end) of the sequence (global positions).
struct TokenSpan {
  int64_t begin = 0, end = 0;
  int64_t tokens() const { return end - begin; }
};

// The spans place `pos` of `places` holds under `layout`, for a sequence made of documents of the
// given lengths (their sum is the sequence), in the place's local order.
std::vector<TokenSpan> layout_spans(CpLayout layout, int64_t pos, int64_t places, const std::vector<int64_t>& doc_lengths);

// The spans a CP rank holds, in its local order (cp_index = position in the CP group), for the
// given documents; without them the plan's document layout (attention_work.hpp, document_layout).
std::vector<TokenSpan> cp_token_spans(const Plan& p, int64_t cp_index, const std::vector<int64_t>& doc_lengths);
std::vector<TokenSpan> cp_token_spans(const Plan& p, int64_t cp_index, int64_t seq);

// Global token indices a CP rank holds, in its local order (cp_token_spans expanded).
std::vector<int64_t> cp_token_indices(const Plan& p, int64_t cp_index, const std::vector<int64_t>& doc_lengths);
std::vector<int64_t> cp_token_indices(const Plan& p, int64_t cp_index, int64_t seq);

// The spans a CP rank's attention runs over: its own for p2p and allgather; for a2a and a2a+p2p,
// those of its whole Ulysses group (the all-to-all gathers the group's tokens and scatters the
// heads): the whole sequence for a2a, the ring position's spans for a2a+p2p.
std::vector<TokenSpan> cp_attention_spans(const Plan& p, int64_t cp_index, const std::vector<int64_t>& doc_lengths);
std::vector<TokenSpan> cp_attention_spans(const Plan& p, int64_t cp_index, int64_t seq);

}  // namespace ctx
