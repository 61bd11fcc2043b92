#include "costmodel/suggest.hpp"

#include <algorithm>
#include <cctype>

namespace ctx {

static std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

size_t edit_distance(const std::string& a0, const std::string& b0) {
  std::string a = lower(a0), b = lower(b0);
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::vector<std::string> closest_names(const std::string& query, const std::vector<std::string>& names, size_t k) {
  std::string q = lower(query);
  std::vector<std::pair<size_t, std::string>> scored;
  for (auto& n : names) {
    size_t d = edit_distance(q, n);
    if (!q.empty() && lower(n).find(q) != std::string::npos) d = 0;  // substring match ranks first
    // only suggest names that are plausibly what was meant
    if (d <= std::max<size_t>(3, n.size() / 2)) scored.push_back({d, n});
  }
  std::stable_sort(scored.begin(), scored.end(), [](auto& x, auto& y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && i < k; ++i) out.push_back(scored[i].second);
  return out;
}

}  // namespace ctx
