// Where a context-parallel rank's tokens sit in the sequence: the one placement the cost model
// prices (attention_work.cpp) and the executor runs (executor/context_parallel.cpp).
//   ring, allgather, ulysses: rank c holds chunk c of cp contiguous chunks
//   zigzag: rank c holds chunks c and 2cp-1-c of 2cp (balances causal work; seq divisible by 2cp)
//   usp (Ulysses x ring): ring position c / u holds the zig-zag pair of 2r chunks (r = ring degree),
//     cut into u equal slices; Ulysses index c % u holds slice c % u
// When the sequence does not divide evenly, the last chunk (and the last slice) takes the remainder;
// check_plan refuses such plans for zigzag and usp, and ctxrun for every kind.
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

// The spans a CP rank holds, in its local order (cp_index = position in the CP group).
std::vector<TokenSpan> cp_token_spans(const Plan& p, int64_t cp_index, int64_t seq);

// Global token indices a CP rank holds, in its local order (cp_token_spans expanded).
std::vector<int64_t> cp_token_indices(const Plan& p, int64_t cp_index, int64_t seq);

// The spans a CP rank's attention runs over: its own for ring kinds; for ulysses and usp, those of
// its whole Ulysses group (the all-to-all gathers the group's tokens and scatters the heads), in
// the group's order: the whole sequence for ulysses, the ring position's zig-zag pair for usp.
std::vector<TokenSpan> cp_attention_spans(const Plan& p, int64_t cp_index, int64_t seq);

}  // namespace ctx
