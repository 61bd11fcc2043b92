#include "costmodel/attention_work.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "costmodel/cp_placement.hpp"

namespace ctx {

std::vector<int64_t> document_layout(const Plan& p, int64_t seq) {
  std::vector<int64_t> lengths;
  if (p.mask != MaskKind::document || p.docs.tokens.empty()) return {seq};
  if (p.docs.kind == DocLengths::Kind::histogram) return priced_packs(p, seq)[0];  // one sampled pack
  const std::vector<int64_t>& pattern = p.docs.tokens;
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

// Query-key pairs between places: out[q place][k place] = pairs (k <= q, same document) of place q's
// query tokens against place k's key tokens, the places' spans partitioning the sequence. One sweep
// over the documents, each pairing only the spans that overlap it: (spans in a document)^2 work,
// so headtail-doc's 2 spans per place and document stay cheap.
std::vector<std::vector<double>> place_pairs(const std::vector<std::vector<TokenSpan>>& spans,
                                             const std::vector<int64_t>& starts, bool rows_only) {
  struct Item { TokenSpan s; size_t place; };
  std::vector<Item> items;
  for (size_t pl = 0; pl < spans.size(); ++pl)
    for (const TokenSpan& s : spans[pl]) items.push_back({s, pl});
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.s.begin < b.s.begin; });
  const size_t n = spans.size();
  std::vector<std::vector<double>> out(n, std::vector<double>(rows_only ? 1 : n, 0.0));
  size_t first = 0;
  for (size_t d = 0; d + 1 < starts.size(); ++d) {
    const int64_t d0 = starts[d], d1 = starts[d + 1];
    while (first < items.size() && items[first].s.end <= d0) ++first;
    for (size_t qi = first; qi < items.size() && items[qi].s.begin < d1; ++qi) {
      const int64_t q0 = std::max(items[qi].s.begin, d0), q1 = std::min(items[qi].s.end, d1);
      if (rows_only) {  // every key of the document up to the query: one block
        out[items[qi].place][0] += causal_block(q0, q1, d0, q1);
        continue;
      }
      for (size_t ki = first; ki < items.size() && items[ki].s.begin < q1; ++ki) {
        const int64_t k0 = std::max(items[ki].s.begin, d0), k1 = std::min(items[ki].s.end, d1);
        out[items[qi].place][items[ki].place] += causal_block(q0, q1, k0, k1);
      }
    }
  }
  return out;
}

std::vector<int64_t> starts_of(const std::vector<int64_t>& doc_lengths) {
  std::vector<int64_t> starts{0};
  for (int64_t len : doc_lengths) starts.push_back(starts.back() + len);
  return starts;
}

// Elementwise mean of per-pack results (all of one shape).
std::vector<std::vector<double>> mean_of(const std::vector<std::vector<std::vector<double>>>& each) {
  std::vector<std::vector<double>> out = each.at(0);
  for (size_t i = 1; i < each.size(); ++i)
    for (size_t a = 0; a < out.size(); ++a)
      for (size_t b = 0; b < out[a].size(); ++b) out[a][b] += each[i][a][b];
  for (auto& row : out)
    for (double& x : row) x /= static_cast<double>(each.size());
  return out;
}

}  // namespace

std::vector<std::vector<double>> attention_pairs_per_step(const Plan& p, const std::vector<int64_t>& doc_lengths) {
  const std::vector<int64_t> starts = starts_of(doc_lengths);
  const int64_t seq = starts.back();
  const int64_t cp = p.cp, u = ulysses_degree(p), r = ring_degree(p);
  std::vector<std::vector<double>> out(static_cast<size_t>(cp));
  if (p.cp_comm == CpComm::a2a || cp == 1) {
    double all = masked_pairs(0, seq, 0, seq, starts);
    for (auto& v : out) v.assign(1, all / static_cast<double>(cp));
    return out;
  }
  // the tokens attention runs over at ring position pos: its CP rank's (p2p, allgather) or its
  // Ulysses group's (a2a+p2p), cp_placement.hpp
  std::vector<std::vector<TokenSpan>> spans(static_cast<size_t>(r));
  for (int64_t pos = 0; pos < r; ++pos) spans[static_cast<size_t>(pos)] = cp_attention_spans(p, pos * u, doc_lengths);
  const bool allgather = p.cp_comm == CpComm::allgather;
  const std::vector<std::vector<double>> m = place_pairs(spans, starts, allgather);
  std::vector<std::vector<double>> by_pos(static_cast<size_t>(r));
  for (int64_t pos = 0; pos < r; ++pos) {
    if (allgather) {  // one step: the rank's queries against every gathered key
      by_pos[static_cast<size_t>(pos)].assign(1, m[static_cast<size_t>(pos)][0]);
      continue;
    }
    for (int64_t step = 0; step < r; ++step) {
      int64_t src = ((pos - step) % r + r) % r;  // keys that arrive at step `step` come from `step` places back
      by_pos[static_cast<size_t>(pos)].push_back(m[static_cast<size_t>(pos)][static_cast<size_t>(src)] / static_cast<double>(u));
    }
  }
  for (int64_t c = 0; c < cp; ++c) out[static_cast<size_t>(c)] = by_pos[static_cast<size_t>(c / u)];
  return out;
}

std::vector<double> attention_pairs_per_rank(const Plan& p, const std::vector<int64_t>& doc_lengths) {
  const std::vector<int64_t> starts = starts_of(doc_lengths);
  const int64_t seq = starts.back();
  const double u = static_cast<double>(ulysses_degree(p));
  if (p.cp == 1 || p.cp_comm == CpComm::a2a)
    return std::vector<double>(static_cast<size_t>(p.cp), masked_pairs(0, seq, 0, seq, starts) / static_cast<double>(p.cp));
  // the queries attention runs on each rank (cp_placement.hpp), each against every key up to it,
  // times the 1/u of the heads a Ulysses rank holds
  std::vector<std::vector<TokenSpan>> spans(static_cast<size_t>(p.cp));
  for (int64_t c = 0; c < p.cp; ++c) spans[static_cast<size_t>(c)] = cp_attention_spans(p, c, doc_lengths);
  if (u > 1) {  // a Ulysses group's ranks share one ring position's spans: price one per position
    std::vector<std::vector<TokenSpan>> pos_spans;
    for (int64_t c = 0; c < p.cp; c += static_cast<int64_t>(u)) pos_spans.push_back(spans[static_cast<size_t>(c)]);
    const std::vector<std::vector<double>> m = place_pairs(pos_spans, starts, true);
    std::vector<double> work(static_cast<size_t>(p.cp));
    for (int64_t c = 0; c < p.cp; ++c) work[static_cast<size_t>(c)] = m[static_cast<size_t>(c / static_cast<int64_t>(u))][0] / u;
    return work;
  }
  const std::vector<std::vector<double>> m = place_pairs(spans, starts, true);
  std::vector<double> work;
  for (auto& row : m) work.push_back(row[0]);
  return work;
}

std::vector<double> attention_pairs_per_rank(const Plan& p, int64_t seq) {
  std::vector<std::vector<std::vector<double>>> each;
  for (const auto& docs : priced_packs(p, seq)) {
    std::vector<std::vector<double>> one;
    for (double w : attention_pairs_per_rank(p, docs)) one.push_back({w});
    each.push_back(std::move(one));
  }
  std::vector<double> out;
  for (auto& row : mean_of(each)) out.push_back(row[0]);
  return out;
}

std::vector<double> attention_pairs_own_keys(const Plan& p, int64_t seq) {
  const int64_t u = ulysses_degree(p);
  std::vector<double> out(static_cast<size_t>(p.cp), 0.0);
  for (int64_t c = 0; c < p.cp; ++c) {
    if (c % u != 0) {  // a Ulysses group's ranks share their ring position's spans
      out[static_cast<size_t>(c)] = out[static_cast<size_t>(c - c % u)];
      continue;
    }
    const std::vector<TokenSpan> spans = cp_attention_spans(p, c, seq);
    double pairs = 0;
    for (const TokenSpan& q : spans)
      for (const TokenSpan& k : spans) pairs += causal_block(q.begin, q.end, k.begin, k.end);
    out[static_cast<size_t>(c)] = pairs / static_cast<double>(u);
  }
  return out;
}

std::vector<std::vector<double>> attention_pairs_per_step(const Plan& p, int64_t seq) {
  std::vector<std::vector<std::vector<double>>> each;
  for (const auto& docs : priced_packs(p, seq)) each.push_back(attention_pairs_per_step(p, docs));
  return mean_of(each);
}

namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double uniform01(uint64_t& s) { return static_cast<double>(splitmix64(s) >> 11) * (1.0 / 9007199254740992.0); }

// The probability a drawn document falls in each bin: the fractions as given (a share of documents),
// or, for a share of tokens, each bin's fraction divided by its mean length (lengths are drawn
// uniformly over the bin, so the mean is the middle of (previous edge, edge]) and renormalised.
std::vector<double> document_probabilities(const DocLengths& d) {
  std::vector<double> prob = d.weights;
  if (!d.token_share) return prob;
  double sum = 0;
  for (size_t i = 0; i < prob.size(); ++i) {
    const double lo = i == 0 ? 1.0 : static_cast<double>(d.tokens[i - 1] + 1), hi = static_cast<double>(d.tokens[i]);
    prob[i] /= (lo + hi) / 2.0;
    sum += prob[i];
  }
  for (double& x : prob) x = sum > 0 ? x / sum : 0.0;
  return prob;
}

int64_t sample_length(const DocLengths& d, const std::vector<double>& prob, uint64_t& s) {
  if (d.kind == DocLengths::Kind::fixed) return d.tokens[0];
  if (d.kind == DocLengths::Kind::list) return d.tokens[splitmix64(s) % d.tokens.size()];
  double x = uniform01(s), acc = 0;
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    acc += prob[i];
    if (x < acc || i + 1 == d.tokens.size()) {
      int64_t lo = i == 0 ? 1 : d.tokens[i - 1] + 1, hi = d.tokens[i];
      return lo + static_cast<int64_t>(uniform01(s) * static_cast<double>(hi - lo + 1));
    }
  }
  return d.tokens.back();
}

double pairs_of(double len) { return len * (len + 1.0) / 2.0; }

}  // namespace

std::vector<std::vector<int64_t>> sample_packs(const Plan& p, int64_t seq, int64_t packs) {
  packs = std::max<int64_t>(1, packs);
  const bool docs = p.mask == MaskKind::document && !p.docs.tokens.empty();
  if (!docs || p.docs.kind == DocLengths::Kind::fixed)
    return std::vector<std::vector<int64_t>>(static_cast<size_t>(packs), document_layout(p, seq));
  uint64_t state = 0x5EEDC0FFEEull;
  const std::vector<double> prob = document_probabilities(p.docs);
  std::vector<int64_t> stream;  // documents in arrival order, enough to fill every pack
  int64_t total = 0;
  const int64_t need = seq * packs;
  while (total < need) {
    int64_t l = std::max<int64_t>(1, std::min(sample_length(p.docs, prob, state), seq));
    stream.push_back(l);
    total += l;
  }
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(packs));
  if (!p.sorted_packing) {
    size_t pack = 0;
    int64_t room = seq;
    for (int64_t l : stream) {
      while (l > 0 && pack < out.size()) {
        int64_t take = std::min(l, room);
        out[pack].push_back(take);
        l -= take;
        room -= take;
        if (room == 0) { ++pack; room = seq; }
      }
      if (pack >= out.size()) break;
    }
    return out;
  }
  std::sort(stream.begin(), stream.end(), std::greater<>());
  std::vector<int64_t> room(static_cast<size_t>(packs), seq);
  std::vector<double> work(static_cast<size_t>(packs), 0.0);
  for (int64_t l : stream) {
    while (l > 0) {
      // the pack with the least work that can take the whole document; else the roomiest pack
      int best = -1, roomiest = 0;
      for (size_t i = 0; i < work.size(); ++i) {
        if (room[i] > room[static_cast<size_t>(roomiest)]) roomiest = static_cast<int>(i);
        if (room[i] >= l && (best < 0 || work[i] < work[static_cast<size_t>(best)])) best = static_cast<int>(i);
      }
      size_t at = static_cast<size_t>(best >= 0 ? best : roomiest);
      if (room[at] == 0) return out;  // every pack is full
      int64_t take = std::min(l, room[at]);
      work[at] += pairs_of(static_cast<double>(take));
      out[at].push_back(take);
      room[at] -= take;
      l -= take;
    }
  }
  return out;
}

std::vector<double> pack_attention_work(const Plan& p, int64_t seq, int64_t packs) {
  std::vector<double> work;
  for (const auto& docs : sample_packs(p, seq, packs)) {
    double w = 0;
    for (int64_t l : docs) w += pairs_of(static_cast<double>(l));
    work.push_back(w);
  }
  return work;
}

std::vector<std::vector<int64_t>> priced_packs(const Plan& p, int64_t seq) {
  const bool hist = p.mask == MaskKind::document && p.docs.kind == DocLengths::Kind::histogram && !p.docs.tokens.empty();
  if (!hist) return {document_layout(p, seq)};
  // in arrival order whatever the packing: packing=sorted changes how work spreads over DP ranks
  // (pack_attention_work), not what a pack represents
  Plan arrival = p;
  arrival.sorted_packing = false;
  return sample_packs(arrival, seq, kPricedPacks);
}

double effective_document_length(const Plan& p, int64_t seq) {
  double sq = 0, sum = 0;
  for (const auto& docs : priced_packs(p, seq))
    for (int64_t l : docs) {
      sq += static_cast<double>(l) * static_cast<double>(l);
      sum += static_cast<double>(l);
    }
  return sum > 0 ? sq / sum : static_cast<double>(seq);
}

namespace {

bool varlen_applies(const Plan& p) {
  return p.mask == MaskKind::document && !p.docs.tokens.empty() && p.cp > 1 && ring_degree(p) > 1 &&
         (p.cp_comm == CpComm::p2p || p.cp_comm == CpComm::a2a_p2p);
}

// split:k's sub-packs of one pack: document i to sub-pack i mod k (the documents spread evenly)
std::vector<std::vector<int64_t>> sub_packs(const std::vector<int64_t>& docs, int64_t k) {
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(k));
  for (size_t i = 0; i < docs.size(); ++i) out[i % static_cast<size_t>(k)].push_back(docs[i]);
  out.erase(std::remove_if(out.begin(), out.end(), [](const std::vector<int64_t>& v) { return v.empty(); }), out.end());
  return out;
}

int64_t total_tokens(const std::vector<int64_t>& docs) {
  int64_t t = 0;
  for (int64_t l : docs) t += l;
  return t;
}

std::vector<std::vector<double>> pairs_for(const Plan& p, const std::vector<int64_t>& docs, bool per_step) {
  if (per_step) return attention_pairs_per_step(p, docs);
  std::vector<std::vector<double>> out;
  for (double w : attention_pairs_per_rank(p, docs)) out.push_back({w});
  return out;
}

}  // namespace

std::vector<AttentionCall> varlen_calls(const Plan& p, int64_t seq, bool per_step) {
  std::vector<AttentionCall> calls;
  if (!varlen_applies(p) || p.cp_varlen.kind == CpVarlen::Kind::native) return calls;
  const std::vector<std::vector<int64_t>> packs = priced_packs(p, seq);
  const double n = static_cast<double>(packs.size()), r = static_cast<double>(ring_degree(p));
  if (p.cp_varlen.kind == CpVarlen::Kind::cycle) {
    // one ring per document; documents of equal length make equal calls, so price each length once
    std::map<int64_t, double> lengths;
    for (const auto& docs : packs)
      for (int64_t l : docs) lengths[l] += 1.0 / n;
    Plan one = p;  // a single document over the ring: the layout within it
    one.cp_layout = p.cp_layout == CpLayout::contiguous ? CpLayout::contiguous : CpLayout::headtail;
    // lengths within 2^(1/8) of each other (a histogram draws nearly every length once) share one
    // call entry: their pairs and hop bytes summed exactly (count-weighted means), the kernel priced at
    // their mean block length, where the efficiency curves change by a few percent at most
    std::map<int64_t, AttentionCall> buckets;
    for (auto [len, count] : lengths) {
      const int64_t key = static_cast<int64_t>(std::floor(8.0 * std::log2(static_cast<double>(len))));
      const std::vector<std::vector<double>> pairs = pairs_for(one, {len}, per_step);
      AttentionCall& b = buckets[key];
      if (b.pairs.empty()) {
        b.pairs.assign(pairs.size(), std::vector<double>(pairs[0].size(), 0.0));
        b.count = b.kv_share = 0;
      }
      b.count += count;
      b.tokens += count * static_cast<double>(len) / r;
      b.kv_share += count * static_cast<double>(len) / static_cast<double>(seq);
      for (size_t i = 0; i < pairs.size(); ++i)
        for (size_t j = 0; j < pairs[i].size(); ++j) b.pairs[i][j] += count * pairs[i][j];
    }
    for (auto& [key, b] : buckets) {
      b.tokens /= b.count;
      b.kv_share /= b.count;
      for (auto& row : b.pairs)
        for (double& x : row) x /= b.count;
      calls.push_back(std::move(b));
    }
    return calls;
  }
  for (const auto& docs : packs)
    for (const auto& sub : sub_packs(docs, p.cp_varlen.split)) {
      const int64_t t = total_tokens(sub);
      double sq = 0;
      for (int64_t l : sub) sq += static_cast<double>(l) * static_cast<double>(l);
      // as native varlen over the sub-pack: its block per step, capped at its work-weighted document length
      const double tokens = std::min(static_cast<double>(t) / r, sq / static_cast<double>(t));
      calls.push_back({1.0 / n, tokens, static_cast<double>(t) / static_cast<double>(seq), pairs_for(p, sub, per_step)});
    }
  return calls;
}

static double padded_lse_rows_uncached(const Plan& p, int64_t seq);

double varlen_padded_lse_rows(const Plan& p, int64_t seq) {
  if (!varlen_applies(p) || p.cp_varlen.kind == CpVarlen::Kind::cycle) return 0;
  // the memory model asks this of every plan a search prices; it depends only on these fields
  thread_local std::map<std::string, double> cache;
  const std::string key = std::to_string(seq) + "|" + std::to_string(p.cp) + "|" + std::to_string(ulysses_degree(p)) + "|" +
                          to_string(p.cp_comm) + "|" + to_string(p.cp_layout) + "|" + to_string(p.cp_varlen) + "|" +
                          mask_to_string(p);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() > 4096) cache.clear();
  return cache[key] = padded_lse_rows_uncached(p, seq);
}

static double padded_lse_rows_uncached(const Plan& p, int64_t seq) {
  const int64_t k = p.cp_varlen.kind == CpVarlen::Kind::split ? p.cp_varlen.split : 1;
  double worst = 0;
  for (const auto& docs : priced_packs(p, seq))
    for (const auto& sub : sub_packs(docs, k)) {
      // each rank's pieces of the documents: its attention spans cut at the document edges
      std::vector<int64_t> starts{0};
      for (int64_t l : sub) starts.push_back(starts.back() + l);
      for (int64_t c = 0; c < p.cp; c += ulysses_degree(p)) {
        int64_t pieces = 0, longest = 0, tokens = 0;
        size_t d = 0;
        for (const TokenSpan& s : cp_attention_spans(p, c, sub)) {
          while (d + 1 < starts.size() && starts[d + 1] <= s.begin) ++d;
          for (size_t e = d; e + 1 < starts.size() && starts[e] < s.end; ++e) {
            const int64_t piece = std::min(s.end, starts[e + 1]) - std::max(s.begin, starts[e]);
            if (piece <= 0) continue;
            ++pieces;  // a document cut in two spans of the rank (head and tail) counts as two rows of the batch
            longest = std::max(longest, piece);
            tokens += piece;
          }
        }
        worst = std::max(worst, static_cast<double>(pieces) * static_cast<double>(longest) - static_cast<double>(tokens));
      }
    }
  return worst;
}

}  // namespace ctx
