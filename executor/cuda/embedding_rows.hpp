// Host-side grouping for the embedding backward: the tokens of each vocabulary row, in token
// order (CSR), so the device sums every row's gradients in the reference's order without atomics.
// Header-only: used by cuda_backend.cpp and by the emulator tests.
#pragma once
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace ctx::exec::cuda {

struct TokenRows {
  std::vector<int32_t> rows;       // vocabulary rows that occur (relative to v0), ascending
  std::vector<int64_t> offsets;    // rows.size() + 1 offsets into positions
  std::vector<int32_t> positions;  // token positions, grouped by row, ascending within a row
  std::vector<std::pair<int32_t, int32_t>> scratch;
};

// Tokens outside [v0, v0 + vrows) are dropped (another vocabulary shard owns them).
inline void group_tokens_by_row(const int32_t* tok, int64_t tokens, int64_t v0, int64_t vrows, TokenRows& g) {
  g.scratch.clear();
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t r = static_cast<int64_t>(tok[t]) - v0;
    if (r >= 0 && r < vrows) g.scratch.emplace_back(static_cast<int32_t>(r), static_cast<int32_t>(t));
  }
  std::sort(g.scratch.begin(), g.scratch.end());
  g.rows.clear();
  g.offsets.clear();
  g.positions.clear();
  for (size_t i = 0; i < g.scratch.size(); ++i) {
    if (i == 0 || g.scratch[i].first != g.scratch[i - 1].first) {
      g.rows.push_back(g.scratch[i].first);
      g.offsets.push_back(static_cast<int64_t>(i));
    }
    g.positions.push_back(g.scratch[i].second);
  }
  g.offsets.push_back(static_cast<int64_t>(g.scratch.size()));
}

}  // namespace ctx::exec::cuda
