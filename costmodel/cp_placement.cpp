#include "costmodel/cp_placement.hpp"

#include <algorithm>
#include <numeric>

#include "costmodel/attention_work.hpp"

namespace ctx {

namespace {

// Chunk `j` of `k` chunks of the run [b, b + n): [b + floor(n*j/k), b + floor(n*(j+1)/k)).
TokenSpan chunk_span(int64_t b, int64_t n, int64_t j, int64_t k) {
  // n <= 2^34 tokens (plan_check) and i <= 2^21 chunks: n * i fits in int64
  auto edge = [&](int64_t i) { return b + n * i / k; };
  return {edge(j), edge(j + 1)};
}

// Place `pos` of `places` over the run [b, b + n): contiguous chunk, or the head-tail pair.
void place_in_run(CpLayout layout, int64_t b, int64_t n, int64_t pos, int64_t places, std::vector<TokenSpan>& out) {
  auto push = [&](TokenSpan s) {
    if (s.tokens() <= 0) return;
    if (!out.empty() && out.back().end == s.begin) out.back().end = s.end;  // adjacent: one span
    else out.push_back(s);
  };
  if (layout == CpLayout::contiguous) {
    push(chunk_span(b, n, pos, places));
    return;
  }
  push(chunk_span(b, n, pos, 2 * places));
  push(chunk_span(b, n, 2 * places - 1 - pos, 2 * places));
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

int64_t total_of(const std::vector<int64_t>& doc_lengths) {
  return std::accumulate(doc_lengths.begin(), doc_lengths.end(), int64_t(0));
}

}  // namespace

std::vector<TokenSpan> layout_spans(CpLayout layout, int64_t pos, int64_t places, const std::vector<int64_t>& doc_lengths) {
  const int64_t seq = total_of(doc_lengths);
  std::vector<TokenSpan> out;
  if (places <= 1) return {{0, seq}};
  if (layout != CpLayout::headtail_doc) {
    place_in_run(layout, 0, seq, pos, places, out);
    return out;
  }
  int64_t at = 0;
  for (int64_t len : doc_lengths) {
    place_in_run(CpLayout::headtail, at, len, pos, places, out);
    at += len;
  }
  return out;
}

std::vector<TokenSpan> cp_token_spans(const Plan& p, int64_t c, const std::vector<int64_t>& doc_lengths) {
  const int64_t seq = total_of(doc_lengths);
  if (p.cp == 1) return {{0, seq}};
  if (p.cp_comm == CpComm::a2a_p2p) {
    const int64_t u = ulysses_degree(p), r = ring_degree(p);
    return slice_of(layout_spans(p.cp_layout, c / u, r, doc_lengths), c % u, u);
  }
  return layout_spans(p.cp_layout, c, p.cp, doc_lengths);
}

std::vector<TokenSpan> cp_token_spans(const Plan& p, int64_t cp_index, int64_t seq) {
  return cp_token_spans(p, cp_index, document_layout(p, seq));
}

std::vector<int64_t> cp_token_indices(const Plan& p, int64_t cp_index, const std::vector<int64_t>& doc_lengths) {
  std::vector<int64_t> out;
  for (const TokenSpan& s : cp_token_spans(p, cp_index, doc_lengths))
    for (int64_t i = s.begin; i < s.end; ++i) out.push_back(i);
  return out;
}

std::vector<int64_t> cp_token_indices(const Plan& p, int64_t cp_index, int64_t seq) {
  return cp_token_indices(p, cp_index, document_layout(p, seq));
}

std::vector<TokenSpan> cp_attention_spans(const Plan& p, int64_t cp_index, const std::vector<int64_t>& doc_lengths) {
  const int64_t seq = total_of(doc_lengths);
  if (p.cp == 1 || p.cp_comm == CpComm::p2p || p.cp_comm == CpComm::allgather) return cp_token_spans(p, cp_index, doc_lengths);
  if (p.cp_comm == CpComm::a2a) return {{0, seq}};
  return layout_spans(p.cp_layout, cp_index / ulysses_degree(p), ring_degree(p), doc_lengths);  // the ring position's tokens
}

std::vector<TokenSpan> cp_attention_spans(const Plan& p, int64_t cp_index, int64_t seq) {
  return cp_attention_spans(p, cp_index, document_layout(p, seq));
}

}  // namespace ctx
