#include "executor/data.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>

#include "costmodel/errors.hpp"

namespace ctx::exec {
namespace {

constexpr int32_t kMagic = 20240520;

// Fills labels (next token; -1 for the last token and, under document masking, for an EOS token
// whose next token starts another document), document ids and positions.
Sequence finish(std::vector<int32_t> window, int32_t eos, bool doc_mask) {
  Sequence s;
  const size_t n = window.size() - 1;
  s.tokens.assign(window.begin(), window.begin() + static_cast<std::ptrdiff_t>(n));
  s.labels.resize(n);
  s.doc.resize(n);
  s.pos.resize(n);
  int32_t doc = 0, pos = 0;
  for (size_t i = 0; i < n; ++i) {
    s.doc[i] = doc_mask ? doc : 0;
    s.pos[i] = doc_mask ? pos : static_cast<int32_t>(i);
    s.labels[i] = window[i + 1];
    if (doc_mask && window[i] == eos) {
      s.labels[i] = -1;  // the next token belongs to another document
      ++doc;
      pos = 0;
    } else {
      ++pos;
    }
  }
  return s;
}

class TokenFile : public Dataset {
 public:
  TokenFile(std::string path, std::vector<uint16_t> toks, DataOptions o)
      : path_(std::move(path)), toks_(std::move(toks)), o_(o) {}
  Sequence sequence(int64_t index) const override {
    const int64_t n = static_cast<int64_t>(toks_.size()), w = o_.seq + 1;
    const int64_t windows = n / w;  // non-overlapping windows, cycling
    const int64_t start = (index % windows) * w;
    std::vector<int32_t> win(toks_.begin() + start, toks_.begin() + start + w);
    return finish(std::move(win), o_.eos, o_.doc_mask);
  }
  std::string describe() const override { return path_ + " (" + std::to_string(toks_.size()) + " tokens)"; }

 private:
  std::string path_;
  std::vector<uint16_t> toks_;
  DataOptions o_;
};

// Documents: [KEY k1 k2 k3 k4] filler... [ASK k1 k2 k3 k4] EOS. The filler follows a fixed random
// bigram table (learnable locally); the answer repeats the key stated at the start of the document
// (learnable only by attending back across the document).
class Synthetic : public Dataset {
 public:
  explicit Synthetic(DataOptions o) : o_(o) {
    std::mt19937_64 rng(o_.seed);
    next_.resize(static_cast<size_t>(o_.vocab));
    for (auto& n : next_) n = static_cast<int32_t>(first_word() + static_cast<int64_t>(rng() % words()));
  }
  Sequence sequence(int64_t index) const override {
    std::mt19937_64 rng(o_.seed * 1000003ull + static_cast<uint64_t>(index));
    const int64_t lo = o_.doc_min > 0 ? o_.doc_min : std::max<int64_t>(12, o_.seq / 8);
    const int64_t hi = o_.doc_max > 0 ? o_.doc_max : std::max<int64_t>(lo, o_.seq / 2);
    std::vector<int32_t> win;
    while (static_cast<int64_t>(win.size()) < o_.seq + 1) {
      int64_t len = lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
      len = std::max<int64_t>(len, 12);
      int32_t key[4];
      for (auto& k : key) k = static_cast<int32_t>(first_word() + static_cast<int64_t>(rng() % words()));
      std::vector<int32_t> doc = {kKey, key[0], key[1], key[2], key[3]};
      int32_t t = key[3];
      while (static_cast<int64_t>(doc.size()) < len - 6) {
        t = (rng() % 8 == 0) ? static_cast<int32_t>(first_word() + static_cast<int64_t>(rng() % words())) : next_[t];
        doc.push_back(t);
      }
      doc.insert(doc.end(), {kAsk, key[0], key[1], key[2], key[3], eos()});
      win.insert(win.end(), doc.begin(), doc.end());
    }
    win.resize(static_cast<size_t>(o_.seq + 1));
    return finish(std::move(win), eos(), o_.doc_mask);
  }
  std::string describe() const override { return "synthetic key-recall documents (seed " + std::to_string(o_.seed) + ")"; }

 private:
  static constexpr int32_t kKey = 1, kAsk = 2;
  int64_t first_word() const { return 3; }
  int64_t words() const { return std::max<int64_t>(1, o_.vocab - 4); }  // ids 3 .. vocab-2
  int32_t eos() const { return o_.eos; }
  DataOptions o_;
  std::vector<int32_t> next_;
};

}  // namespace

std::unique_ptr<Dataset> open_token_file(const std::string& path, const DataOptions& o) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path, "", "is a folder; expected an llm.c token file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path, "", "cannot open the token file");
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_token_file(bytes, path, o);
}

std::unique_ptr<Dataset> parse_token_file(const std::string& bytes, const std::string& path, const DataOptions& o) {
  int32_t header[256];
  if (bytes.size() < sizeof(header))
    throw InputError(path, "header", "truncated: an llm.c token file starts with a 1024-byte header");
  std::memcpy(header, bytes.data(), sizeof(header));
  if (header[0] != kMagic)
    throw InputError(path, "header", "bad magic " + std::to_string(header[0]) + " (llm.c token files start with " +
                                         std::to_string(kMagic) + ")");
  if (header[1] != 1) throw InputError(path, "header", "version " + std::to_string(header[1]) + " (expected 1: uint16 tokens)");
  const int64_t n = header[2];
  if (n <= 0) throw InputError(path, "header", "token count " + std::to_string(n) + " must be positive");
  // the count is checked against the bytes there before anything is sized from it
  const int64_t held = static_cast<int64_t>((bytes.size() - sizeof(header)) / 2);
  if (held < n)
    throw InputError(path, "tokens", "truncated: the header promises " + std::to_string(n) + " tokens, the file holds " +
                                         std::to_string(held));
  std::vector<uint16_t> toks(static_cast<size_t>(n));
  std::memcpy(toks.data(), bytes.data() + sizeof(header), static_cast<size_t>(n) * 2);
  for (int64_t i = 0; i < n; ++i)
    if (toks[i] >= o.vocab)
      throw InputError(path, "tokens", "token " + std::to_string(toks[i]) + " at position " + std::to_string(i) +
                                           " is outside the model's vocabulary of " + std::to_string(o.vocab));
  if (n < o.seq + 1)
    throw InputError(path, "tokens", std::to_string(n) + " tokens cannot fill one sequence of " + std::to_string(o.seq) +
                                         " (+1 for the labels)");
  DataOptions oo = o;
  if (oo.eos < 0) oo.eos = o.vocab > 50256 ? 50256 : static_cast<int32_t>(o.vocab - 1);
  return std::make_unique<TokenFile>(path, std::move(toks), oo);
}

std::unique_ptr<Dataset> make_synthetic(const DataOptions& o) {
  DataOptions oo = o;
  if (oo.eos < 0) oo.eos = static_cast<int32_t>(o.vocab - 1);
  return std::make_unique<Synthetic>(oo);
}

void write_token_file(const std::string& path, const std::vector<uint16_t>& tokens) {
  std::ofstream f(path, std::ios::binary);
  int32_t header[256] = {};
  header[0] = kMagic;
  header[1] = 1;
  header[2] = static_cast<int32_t>(tokens.size());
  f.write(reinterpret_cast<const char*>(header), sizeof(header));
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
}

double attention_work(const Sequence& s) {
  double work = 0, run = 0;
  for (size_t i = 0; i < s.doc.size(); ++i) {
    if (i > 0 && s.doc[i] != s.doc[i - 1]) { work += run * run; run = 0; }
    run += 1;
  }
  return work + run * run;
}

std::vector<std::vector<int64_t>> step_assignment(const Dataset& d, int64_t step, int64_t dp, int64_t per_rank,
                                                  bool sorted) {
  const int64_t n = dp * per_rank, base = step * n;
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(dp));
  if (!sorted) {
    for (int64_t r = 0; r < dp; ++r)
      for (int64_t j = 0; j < per_rank; ++j) out[r].push_back(base + r * per_rank + j);
    return out;
  }
  std::vector<std::pair<double, int64_t>> work;
  for (int64_t i = 0; i < n; ++i) work.push_back({attention_work(d.sequence(base + i)), base + i});
  std::stable_sort(work.begin(), work.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<double> load(static_cast<size_t>(dp), 0.0);
  for (auto& [w, idx] : work) {
    int64_t best = -1;
    for (int64_t r = 0; r < dp; ++r)
      if (static_cast<int64_t>(out[r].size()) < per_rank && (best < 0 || load[r] < load[best])) best = r;
    out[best].push_back(idx);
    load[best] += w;
  }
  return out;
}

}  // namespace ctx::exec
