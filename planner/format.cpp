#include "planner/format.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "costmodel/errors.hpp"
#include "costmodel/plan.hpp"

namespace ctx {

std::string fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

std::string gib(double bytes, int decimals) { return fixed(bytes / (1024.0 * 1024.0 * 1024.0), decimals); }

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024.0 && u < 5) { v /= 1024.0; ++u; }
  return fixed(v, u == 0 ? 0 : (std::fabs(v) < 10 ? 2 : 1)) + " " + units[u];
}

std::string human_count(double n) {
  const char* units[] = {"", " K", " M", " B", " T"};
  int u = 0;
  while (std::fabs(n) >= 1000.0 && u < 4) { n /= 1000.0; ++u; }
  return fixed(n, u == 0 ? 0 : 2) + units[u];
}

std::string Table::render(const std::string& indent) const {
  std::vector<size_t> w(header.size(), 0);
  auto widen = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < w.size(); ++i) w[i] = std::max(w[i], row[i].size());
  };
  widen(header);
  for (auto& r : rows) widen(r);
  std::ostringstream os;
  auto line = [&](const std::vector<std::string>& row) {
    os << indent;
    for (size_t i = 0; i < row.size() && i < w.size(); ++i) {
      std::string pad(w[i] - row[i].size(), ' ');
      if (i == 0) os << row[i] << pad;
      else os << "  " << pad << row[i];
    }
    os << "\n";
  };
  line(header);
  size_t total = 0;
  for (size_t x : w) total += x + 2;
  os << indent << std::string(total > 2 ? total - 2 : 0, '-') << "\n";
  for (auto& r : rows) line(r);
  return os.str();
}

int64_t parse_tokens(const std::string& text, const std::string& where) {
  double v = 0;
  // decimal with the k/m suffixes only (no exponent, no hex: `--seq 0x100` was taken)
  if (text.find_first_of("eE") != std::string::npos || !parse_scaled_number(text, &v))
    throw InputError(where, "", "expected a token count such as 131072, 128k or 1m, got '" + text + "'");
  double tokens = std::round(v);
  if (tokens < 1 || tokens > 17179869184.0)
    throw InputError(where, "", "token count must be 1..17179869184 (16Gi), got '" + text + "'");
  return static_cast<int64_t>(tokens);
}

}  // namespace ctx
