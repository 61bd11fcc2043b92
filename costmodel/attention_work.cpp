#include "costmodel/attention_work.hpp"

#include <algorithm>

namespace ctx {

std::vector<int64_t> document_layout(const Plan& p, int64_t seq) {
  std::vector<int64_t> lengths;
  if (p.mask != MaskKind::document || p.docs.tokens.empty()) return {seq};
  std::vector<int64_t> pattern;
  if (p.docs.kind == DocLengths::Kind::histogram) {
    // 100 documents per cycle, each bin contributing round(fraction * 100) documents at its edge
    for (size_t i = 0; i < p.docs.tokens.size(); ++i) {
      int64_t n = static_cast<int64_t>(p.docs.weights[i] * 100.0 + 0.5);
      for (int64_t j = 0; j < n; ++j) pattern.push_back(p.docs.tokens[i]);
    }
    if (pattern.empty()) pattern.push_back(p.docs.tokens.back());
  } else {
    pattern = p.docs.tokens;
  }
  int64_t used = 0;
  for (size_t i = 0; used < seq; i = (i + 1) % pattern.size()) {
    int64_t len = std::min(pattern[i], seq - used);
    lengths.push_back(len);
    used += len;
  }
  return lengths;
}

namespace {

// sum over q in [a, b) of (number of k in [k0, min(k1, q+1))), for one document's ranges
double causal_block(int64_t a, int64_t b, int64_t k0, int64_t k1) {
  if (a >= b || k0 >= k1) return 0;
  double total = 0;
  // region 1: q < k0 -> 0 keys. region 2: k0 <= q < k1 -> q - k0 + 1 keys. region 3: q >= k1 -> k1 - k0 keys.
  int64_t r2a = std::max(a, k0), r2b = std::min(b, k1);
  if (r2a < r2b) {
    double first = static_cast<double>(r2a - k0 + 1), last = static_cast<double>(r2b - 1 - k0 + 1);
    total += (first + last) * static_cast<double>(r2b - r2a) / 2.0;  // arithmetic series
  }
  int64_t r3a = std::max(a, k1);
  if (r3a < b) total += static_cast<double>(b - r3a) * static_cast<double>(k1 - k0);
  return total;
}

}  // namespace

double masked_pairs(int64_t q0, int64_t q1, int64_t k0, int64_t k1, const std::vector<int64_t>& doc_starts) {
  double total = 0;
  for (size_t d = 0; d + 1 < doc_starts.size(); ++d) {
    int64_t d0 = doc_starts[d], d1 = doc_starts[d + 1];
    if (d1 <= q0 || d0 >= q1 || d1 <= k0 || d0 >= k1) continue;
    total += causal_block(std::max(q0, d0), std::min(q1, d1), std::max(k0, d0), std::min(k1, d1));
  }
  return total;
}

std::vector<double> attention_pairs_per_rank(const Plan& p, int64_t seq) {
  std::vector<int64_t> lengths = document_layout(p, seq);
  std::vector<int64_t> starts{0};
  for (int64_t len : lengths) starts.push_back(starts.back() + len);
  const int64_t cp = p.cp;
  std::vector<double> work(static_cast<size_t>(cp), 0.0);
  if (p.cp_kind == CpKind::ulysses) {
    double all = masked_pairs(0, seq, 0, seq, starts);
    for (auto& w : work) w = all / static_cast<double>(cp);
    return work;
  }
  const bool zigzag = p.cp_kind == CpKind::zigzag || p.cp_kind == CpKind::usp;
  const int64_t chunks = zigzag ? 2 * cp : cp;
  const int64_t chunk = seq / chunks;
  for (int64_t r = 0; r < cp; ++r) {
    std::vector<int64_t> mine{r};
    if (zigzag) mine.push_back(2 * cp - 1 - r);
    for (int64_t c : mine) {
      int64_t q0 = c * chunk, q1 = (c == chunks - 1) ? seq : q0 + chunk;
      work[static_cast<size_t>(r)] += masked_pairs(q0, q1, 0, q1, starts);  // keys: everything up to the chunk's end
    }
  }
  return work;
}

}  // namespace ctx
