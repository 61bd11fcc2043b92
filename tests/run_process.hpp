// Test helper: runs a binary with arguments (fork + exec, no shell), capturing stdout and stderr
// in temporary files (no pipe deadlock on large output), and returns them with the exit code.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace ctx::testing {

struct RunResult {
  int exit_code = -1;
  std::string out, err;
  std::string both() const { return out + err; }
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline RunResult run_process(const std::string& bin, const std::vector<std::string>& args) {
  char out_tmpl[] = "/tmp/ctxplan_test_out_XXXXXX";
  char err_tmpl[] = "/tmp/ctxplan_test_err_XXXXXX";
  int out_fd = mkstemp(out_tmpl);
  int err_fd = mkstemp(err_tmpl);
  RunResult r;
  if (out_fd < 0 || err_fd < 0) {
    ADD_FAILURE() << "mkstemp failed";
    return r;
  }
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    std::string b = bin;
    std::vector<std::string> copy = args;
    std::vector<char*> argv{b.data()};
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(b.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  close(out_fd);
  close(err_fd);
  r.out = slurp(out_tmpl);
  r.err = slurp(err_tmpl);
  unlink(out_tmpl);
  unlink(err_tmpl);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

}  // namespace ctx::testing
