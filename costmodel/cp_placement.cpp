#include "costmodel/cp_placement.hpp"

#include <algorithm>

namespace ctx {

namespace {

// Chunk `c` of `chunks` equal chunks of [0, seq); the last one takes the remainder.
TokenSpan chunk_span(int64_t c, int64_t chunks, int64_t seq) {
  const int64_t len = seq / chunks;
  return {c * len, c == chunks - 1 ? seq : (c + 1) * len};
}

// The zig-zag pair of ring position `pos` of `r`: chunks pos and 2r-1-pos of 2r.
std::vector<TokenSpan> zigzag_pair(int64_t pos, int64_t r, int64_t seq) {
  return {chunk_span(pos, 2 * r, seq), chunk_span(2 * r - 1 - pos, 2 * r, seq)};
}

// Slice `i` of `u` equal slices of the tokens the spans hold, in order; the last takes the remainder.
std::vector<TokenSpan> slice_of(const std::vector<TokenSpan>& spans, int64_t i, int64_t u) {
  int64_t total = 0;
  for (const TokenSpan& s : spans) total += s.tokens();
  const int64_t len = total / u, from = i * len, to = i == u - 1 ? total : from + len;
  std::vector<TokenSpan> out;
  int64_t at = 0;  // tokens of `spans` before the current one
  for (const TokenSpan& s : spans) {
    const int64_t a = std::max(from, at), b = std::min(to, at + s.tokens());
    if (a < b) out.push_back({s.begin + (a - at), s.begin + (b - at)});
    at += s.tokens();
  }
  return out;
}

}  // namespace

std::vector<TokenSpan> cp_token_spans(const Plan& p, int64_t c, int64_t seq) {
  const int64_t cp = p.cp;
  if (cp == 1) return {{0, seq}};
  switch (p.cp_kind) {
    case CpKind::zigzag: return zigzag_pair(c, cp, seq);
    case CpKind::usp: {
      const int64_t u = ulysses_degree(p), r = ring_degree(p);
      const std::vector<TokenSpan> ring_set = r == 1 ? std::vector<TokenSpan>{{0, seq}} : zigzag_pair(c / u, r, seq);
      return slice_of(ring_set, c % u, u);
    }
    case CpKind::ring:
    case CpKind::allgather:
    case CpKind::ulysses: break;
  }
  return {chunk_span(c, cp, seq)};
}

std::vector<int64_t> cp_token_indices(const Plan& p, int64_t cp_index, int64_t seq) {
  std::vector<int64_t> out;
  for (const TokenSpan& s : cp_token_spans(p, cp_index, seq))
    for (int64_t i = s.begin; i < s.end; ++i) out.push_back(i);
  return out;
}

std::vector<TokenSpan> cp_attention_spans(const Plan& p, int64_t cp_index, int64_t seq) {
  const int64_t u = ulysses_degree(p);
  if (p.cp == 1 || u == 1) return cp_token_spans(p, cp_index, seq);
  // the Ulysses group of cp_index: u consecutive CP indices (process_groups.hpp, Group::ulysses)
  std::vector<TokenSpan> out;
  const int64_t first = cp_index / u * u;
  for (int64_t i = first; i < first + u; ++i) {
    std::vector<TokenSpan> part = cp_token_spans(p, i, seq);
    for (const TokenSpan& s : part) {
      if (!out.empty() && out.back().end == s.begin) out.back().end = s.end;  // contiguous: one span
      else out.push_back(s);
    }
  }
  return out;
}

}  // namespace ctx
