// Reads the reference points the repo carries in profiles/validation/ (copied, with sources,
// from published write-ups; the project never reads ../shared at run time).
#pragma once
#include <fstream>
#include <string>
#include <vector>

#include "costmodel/json_util.hpp"

namespace ctx::test {

inline std::vector<json> read_jsonl(const std::string& name) {
  std::string path = std::string(CTXPLAN_SOURCE_DIR) + "/profiles/validation/" + name;
  std::ifstream in(path);
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(parse_json_text(line, path));
  return out;
}

inline json find_point(const std::vector<json>& points, const std::string& id) {
  for (auto& p : points)
    if (p.at("id") == id) return p;
  throw std::runtime_error("validation point not found: " + id);
}

}  // namespace ctx::test
