#include "costmodel/attention_work.hpp"

#include <algorithm>

#include "costmodel/cp_placement.hpp"

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

namespace {

std::vector<int64_t> document_starts(const Plan& p, int64_t seq) {
  std::vector<int64_t> starts{0};
  for (int64_t len : document_layout(p, seq)) starts.push_back(starts.back() + len);
  return starts;
}

}  // namespace

std::vector<double> attention_pairs_per_rank(const Plan& p, int64_t seq) {
  const std::vector<int64_t> starts = document_starts(p, seq);
  const double u = static_cast<double>(ulysses_degree(p));
  std::vector<double> work(static_cast<size_t>(p.cp), 0.0);
  for (int64_t c = 0; c < p.cp; ++c) {
    // the queries attention runs on this rank (cp_placement.hpp), each against every key up to it,
    // times the 1/u of the heads a Ulysses rank holds
    for (const TokenSpan& q : cp_attention_spans(p, c, seq))
      work[static_cast<size_t>(c)] += masked_pairs(q.begin, q.end, 0, q.end, starts) / u;
  }
  return work;
}

std::vector<std::vector<double>> attention_pairs_per_step(const Plan& p, int64_t seq) {
  const std::vector<int64_t> starts = document_starts(p, seq);
  const int64_t cp = p.cp, u = ulysses_degree(p), r = ring_degree(p);
  std::vector<std::vector<double>> out(static_cast<size_t>(cp));
  if (p.cp_kind == CpKind::ulysses || cp == 1) {
    double all = masked_pairs(0, seq, 0, seq, starts);
    for (auto& v : out) v.assign(1, all / static_cast<double>(cp));
    return out;
  }
  // the tokens attention runs over at ring position pos: those of its first CP rank's Ulysses group
  auto spans_at = [&](int64_t pos) { return cp_attention_spans(p, pos * u, seq); };
  std::vector<std::vector<double>> by_pos(static_cast<size_t>(r));
  for (int64_t pos = 0; pos < r; ++pos) {
    const std::vector<TokenSpan> mine = spans_at(pos);
    if (p.cp_kind == CpKind::allgather) {
      double w = 0;
      for (const TokenSpan& q : mine) w += masked_pairs(q.begin, q.end, 0, q.end, starts);
      by_pos[static_cast<size_t>(pos)].assign(1, w);
      continue;
    }
    for (int64_t step = 0; step < r; ++step) {
      int64_t src = ((pos - step) % r + r) % r;  // keys that arrive at step `step` come from `step` places back
      double w = 0;
      for (const TokenSpan& q : mine)
        for (const TokenSpan& k : spans_at(src)) w += masked_pairs(q.begin, q.end, k.begin, k.end, starts);
      by_pos[static_cast<size_t>(pos)].push_back(w / static_cast<double>(u));
    }
  }
  for (int64_t c = 0; c < cp; ++c) out[static_cast<size_t>(c)] = by_pos[static_cast<size_t>(c / u)];
  return out;
}

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double uniform01(uint64_t& s) { return static_cast<double>(splitmix64(s) >> 11) * (1.0 / 9007199254740992.0); }

int64_t sample_length(const DocLengths& d, uint64_t& s) {
  if (d.kind == DocLengths::Kind::fixed) return d.tokens[0];
  if (d.kind == DocLengths::Kind::list) return d.tokens[splitmix64(s) % d.tokens.size()];
  double x = uniform01(s), acc = 0;
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    acc += d.weights[i];
    if (x < acc || i + 1 == d.tokens.size()) {
      int64_t lo = i == 0 ? 1 : d.tokens[i - 1] + 1, hi = d.tokens[i];
      return lo + static_cast<int64_t>(uniform01(s) * static_cast<double>(hi - lo + 1));
    }
  }
  return d.tokens.back();
}

double pairs_of(double len) { return len * (len + 1.0) / 2.0; }

}  // namespace

std::vector<double> pack_attention_work(const Plan& p, int64_t seq, int64_t packs) {
  packs = std::max<int64_t>(1, packs);
  const bool docs = p.mask == MaskKind::document && !p.docs.tokens.empty();
  if (!docs || p.docs.kind == DocLengths::Kind::fixed) {
    std::vector<int64_t> layout = document_layout(p, seq);
    double w = 0;
    for (int64_t l : layout) w += pairs_of(static_cast<double>(l));
    return std::vector<double>(static_cast<size_t>(packs), w);
  }
  uint64_t state = 0x5EEDC0FFEEull;
  std::vector<int64_t> stream;  // documents in arrival order, enough to fill every pack
  int64_t total = 0;
  const int64_t need = seq * packs;
  while (total < need) {
    int64_t l = std::max<int64_t>(1, std::min(sample_length(p.docs, state), seq));
    stream.push_back(l);
    total += l;
  }
  std::vector<double> work(static_cast<size_t>(packs), 0.0);
  if (!p.sorted_packing) {
    size_t pack = 0;
    int64_t room = seq;
    for (int64_t l : stream) {
      while (l > 0 && pack < work.size()) {
        int64_t take = std::min(l, room);
        work[pack] += pairs_of(static_cast<double>(take));
        l -= take;
        room -= take;
        if (room == 0) { ++pack; room = seq; }
      }
      if (pack >= work.size()) break;
    }
    return work;
  }
  std::sort(stream.begin(), stream.end(), std::greater<>());
  std::vector<int64_t> room(static_cast<size_t>(packs), seq);
  for (int64_t l : stream) {
    while (l > 0) {
      // the pack with the least work that can take the whole document; else the roomiest pack
      int best = -1, roomiest = 0;
      for (size_t i = 0; i < work.size(); ++i) {
        if (room[i] > room[static_cast<size_t>(roomiest)]) roomiest = static_cast<int>(i);
        if (room[i] >= l && (best < 0 || work[i] < work[static_cast<size_t>(best)])) best = static_cast<int>(i);
      }
      size_t at = static_cast<size_t>(best >= 0 ? best : roomiest);
      if (room[at] == 0) return work;  // every pack is full
      int64_t take = std::min(l, room[at]);
      work[at] += pairs_of(static_cast<double>(take));
      room[at] -= take;
      l -= take;
    }
  }
  return work;
}

double effective_document_length(const Plan& p, int64_t seq) {
  double sq = 0, sum = 0;
  for (int64_t l : document_layout(p, seq)) {
    sq += static_cast<double>(l) * static_cast<double>(l);
    sum += static_cast<double>(l);
  }
  return sum > 0 ? sq / sum : static_cast<double>(seq);
}

}  // namespace ctx
