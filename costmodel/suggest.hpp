// "Did you mean": the closest names to a mistyped one, by edit distance.
#pragma once
#include <string>
#include <vector>

namespace ctx {

// Case-insensitive Levenshtein distance.
size_t edit_distance(const std::string& a, const std::string& b);
// Up to `k` names nearest to `query`, nearest first; names containing the query come first.
std::vector<std::string> closest_names(const std::string& query, const std::vector<std::string>& names, size_t k);

}  // namespace ctx
