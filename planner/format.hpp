// Text output: byte sizes, aligned tables.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ctx {

std::string gib(double bytes, int decimals = 2);       // "12.34" (GiB)
std::string human_bytes(double bytes);                 // "12.3 GiB", "512 MiB"
std::string human_count(double n);                     // "8.03 B", "128 K"
std::string fixed(double v, int decimals);

// A plain aligned table: first column left-aligned, the rest right-aligned.
struct Table {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
  std::string render(const std::string& indent = "  ") const;
};

// Parses a token count: 131072, 128k (x1024), 1m (x1048576), 1.1e6.
int64_t parse_tokens(const std::string& text, const std::string& where);

}  // namespace ctx
