// Test helper for the ctxrun CLI tests: a shell command with stdout and stderr captured together,
// the command line that runs ctxrun on N ranks (under mpirun, oversubscribed, when N > 1), and the
// plan case the parameterised ctxrun tests (memory fidelity, schedule) iterate over.
// CTXRUN_BIN and MPIRUN come from the test's compile definitions.
#pragma once
#include <sys/wait.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>

namespace ctx::exec::testing {

struct Result {
  int code = -1;
  std::string out;
};

inline Result sh(const std::string& cmd) {
  Result r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p && fgets(buf, sizeof(buf), p)) r.out += buf;
  int st = p ? pclose(p) : -1;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// A fresh, empty folder for one test: <temp>/<prefix>_<pid>_<name>.
inline std::filesystem::path scratch(const std::string& prefix, const std::string& name) {
  std::filesystem::path p = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline std::string ctxrun(int ranks, const std::string& args) {
  std::string bin = CTXRUN_BIN;
  if (ranks <= 1) return bin + " " + args;
  return std::string(MPIRUN) + " --allow-run-as-root --oversubscribe --bind-to none -np " + std::to_string(ranks) + " " +
         bin + " " + args;
}

// One ctxrun job of a parameterised test: ranks, model profile, tokens per sequence, plan.
struct PlanCase {
  int ranks;
  const char* model;
  int seq;
  const char* plan;
};

inline std::ostream& operator<<(std::ostream& o, const PlanCase& c) {
  return o << c.ranks << " ranks, " << c.model << ", seq " << c.seq << ", " << c.plan;
}

}  // namespace ctx::exec::testing
