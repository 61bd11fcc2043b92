#include "planner/launch.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "costmodel/errors.hpp"
#include "planner/format.hpp"

extern char** environ;

namespace ctx {
namespace {

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += sep;
    s += v[i];
  }
  return s;
}

std::string sanitize_job_name(const std::string& s) {
  std::string out;
  for (char ch : s) out += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '-') ? ch : '-';
  return out;
}

std::string prediction_line(const Prediction& p) {
  const MemoryPrediction& m = p.memory;
  return "peak " + human_bytes(m.peak.total()) + " per GPU (" + to_string(m.peak_phase) + ") of " +
         human_bytes(m.device_capacity_bytes) + " usable; step " + fixed(p.time.step_seconds, 6) + " s, " +
         fixed(p.time.tokens_per_second, 0) + " tokens/s, MFU " + fixed(100.0 * p.time.mfu, 1) + "% (runtime " +
         p.runtime + ")";
}

// The groups of the mpirun line, one printed line each: placement, environment, extra mpirun
// options, the executable, ctxrun's job arguments.
std::vector<std::vector<std::string>> mpirun_lines(const LaunchRequest& r, const LaunchCommand& c) {
  std::vector<std::vector<std::string>> lines;
  // one rank per GPU, node by node: ranks r*G..r*G+G-1 share node r, so the innermost plan
  // dimension (TP by default) stays on NVLink. A local run places them all on this machine.
  std::string ppr = "ppr:" + std::to_string(r.local ? c.world : c.ranks_per_node) + ":node";
  std::string bind = r.local ? "none" : r.bind;
  if (bind == "core") ppr += ":PE=" + std::to_string(r.cpus_per_rank);  // each rank its own cores
  std::vector<std::string> place = {r.mpirun, "-np", std::to_string(c.world), "--map-by", ppr, "--bind-to", bind};
  if (r.local) place.push_back("--oversubscribe");
  lines.push_back(place);
  std::vector<std::string> env;
  for (auto& [k, v] : c.env) {
    env.push_back("-x");
    env.push_back(k + "=" + v);
  }
  for (auto& name : c.forwarded) {
    env.push_back("-x");
    env.push_back(name);
  }
  lines.push_back(env);
  if (!r.mpirun_extra.empty()) lines.push_back(r.mpirun_extra);
  lines.push_back({c.ctxrun_argv.front()});
  lines.push_back(std::vector<std::string>(c.ctxrun_argv.begin() + 1, c.ctxrun_argv.end()));
  return lines;
}

std::string continued(const std::vector<std::vector<std::string>>& lines, const std::string& indent) {
  std::string s;
  bool first = true;
  for (auto& l : lines) {
    if (l.empty()) continue;
    s += (first ? "" : " \\\n" + indent) + shell_join(l);
    first = false;
  }
  return s + "\n";
}

}  // namespace

void check_launch_world(const Plan& p, const ClusterSpec& c, const std::string& where) {
  if (p.pp > 1 || p.vpp > 1)
    throw InputError(where, "pp", "ctxrun does not run pipeline parallelism yet (pp=" + std::to_string(p.pp) + ", vpp=" +
                                      std::to_string(p.vpp) + "); valid: pp=1, or `ctxplan export megatron` "
                                      "(or torchtitan) for a stack that runs it");
  const int64_t world = world_size(c), tpcp = p.tp * p.cp;
  const std::string layout = c.name + " has " + std::to_string(world) + " GPUs (" + std::to_string(c.nodes) + " node" +
                             (c.nodes == 1 ? "" : "s") + " x " + std::to_string(c.gpus_per_node) + ")";
  if (tpcp < 1) throw InputError(where, "tp", "tp and cp must be >= 1");
  if (p.dp > 0 && p.dp * tpcp != world) {
    const int64_t ranks = p.dp * tpcp;
    std::vector<std::string> valid;
    if (world % tpcp == 0) valid.push_back("dp=" + std::to_string(world / tpcp) + " on this cluster");
    if (ranks % c.gpus_per_node == 0)
      valid.push_back("--cluster " + std::to_string(ranks / c.gpus_per_node) + "x" + std::to_string(c.gpus_per_node) + "x" +
                      c.gpu.name);
    else if (ranks < c.gpus_per_node)
      valid.push_back("--cluster 1x" + std::to_string(ranks) + "x" + c.gpu.name);
    throw InputError(where, "dp", "the plan runs dp*tp*cp = " + std::to_string(p.dp) + "*" + std::to_string(p.tp) + "*" +
                                      std::to_string(p.cp) + " = " + std::to_string(ranks) + " ranks, but " + layout +
                                      "; one rank per GPU, whole nodes" +
                                      (valid.empty() ? std::string() : "; valid: " + join(valid, ", or ")));
  }
  if (p.dp == 0 && world % tpcp != 0)
    throw InputError(where, "tp", "tp*cp = " + std::to_string(tpcp) + " does not divide the GPUs: " + layout);
}

LaunchCommand make_launch_command(const LaunchRequest& r) {
  LaunchCommand c;
  c.world = world_size(r.cluster);
  c.nodes = r.cluster.nodes;
  c.ranks_per_node = r.cluster.gpus_per_node;
  // The environment every rank gets, and why:
  //  CUDA_DEVICE_MAX_CONNECTIONS=1: one hardware work queue, so TP/SP collectives start in the order
  //    the compute stream issues them (Megatron's requirement for overlapping them with GEMMs).
  //  OMP_NUM_THREADS: threads per rank = the cores it is given (CPU backend, host optimizer), never
  //    more, so ranks on a node do not oversubscribe its cores.
  //  NCCL_DEBUG=WARN: NCCL reports warnings and errors only (INFO when debugging the topology).
  c.env = {{"CUDA_DEVICE_MAX_CONNECTIONS", "1"},
           {"OMP_NUM_THREADS", std::to_string(r.cpus_per_rank)}};
  bool caller_nccl_debug = std::getenv("NCCL_DEBUG") != nullptr;
  if (!caller_nccl_debug) c.env.push_back({"NCCL_DEBUG", "WARN"});
  for (const std::string& kv : r.env) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw InputError("--env", "", "expected NAME=VALUE, got '" + kv + "'");
    std::string name = kv.substr(0, eq);
    bool replaced = false;
    for (auto& e : c.env)
      if (e.first == name) { e.second = kv.substr(eq + 1); replaced = true; }
    if (!replaced) c.env.push_back({name, kv.substr(eq + 1)});
  }
  // NCCL_* set where the command is generated (interfaces, IB HCAs, ...) go to every rank by name;
  // across nodes, PATH and LD_LIBRARY_PATH too so remote ranks find ctxrun and its libraries.
  for (char** e = environ; e && *e; ++e) {
    std::string kv = *e;
    if (kv.rfind("NCCL_", 0) != 0) continue;
    std::string name = kv.substr(0, kv.find('='));
    bool set = false;
    for (auto& x : c.env) set = set || x.first == name;
    if (!set) c.forwarded.push_back(name);
  }
  std::sort(c.forwarded.begin(), c.forwarded.end());
  if (c.nodes > 1 && !r.local) {
    if (std::getenv("PATH")) c.forwarded.push_back("PATH");
    if (std::getenv("LD_LIBRARY_PATH")) c.forwarded.push_back("LD_LIBRARY_PATH");
  }
  // ctxrun's own option names (executor/ctxrun_main.cpp)
  c.ctxrun_argv = {r.ctxrun, "--backend", r.backend, "--model", r.model_arg, "--seq", std::to_string(r.seq),
                   "--cluster", r.cluster_arg};
  if (!r.profiles_dir.empty()) {
    c.ctxrun_argv.push_back("--profiles");
    c.ctxrun_argv.push_back(r.profiles_dir);
  }
  if (!r.plan_file.empty()) {
    c.ctxrun_argv.push_back("--plan-file");
    c.ctxrun_argv.push_back(r.plan_file);
  } else {
    c.ctxrun_argv.push_back("--plan");
    c.ctxrun_argv.push_back(plan_to_string(r.plan));
  }
  c.ctxrun_argv.push_back("--steps");
  c.ctxrun_argv.push_back(std::to_string(r.steps));
  if (!r.report.empty()) {
    c.ctxrun_argv.push_back("--report");
    c.ctxrun_argv.push_back(r.report);
  }
  if (r.no_fit_check) c.ctxrun_argv.push_back("--no-fit-check");
  for (auto& w : r.ctxrun_extra) c.ctxrun_argv.push_back(w);
  for (auto& l : mpirun_lines(r, c))
    for (auto& w : l) c.mpirun_argv.push_back(w);
  return c;
}

std::string launch_text(const LaunchRequest& r, const LaunchCommand& c, const Prediction& p) {
  std::ostringstream os;
  os << "# ctxplan launch: " << p.model << " on " << p.cluster << " (" << c.nodes << " node" << (c.nodes == 1 ? "" : "s")
     << " x " << c.ranks_per_node << " " << p.gpu << "), seq " << p.seq << " tokens\n";
  os << "# plan: " << plan_to_string(p.plan) << " -> " << c.world << " ranks, " << c.ranks_per_node << " per node"
     << (r.local ? " (local: all on this machine, oversubscribed, unbound)" : "") << "\n";
  os << "# predicted: " << prediction_line(p) << "\n";
  for (auto& w : p.warnings) os << "# warning: " << w << "\n";
  os << continued(mpirun_lines(r, c), "  ");
  return os.str();
}

std::string slurm_script(const LaunchRequest& r, const LaunchCommand& c, const Prediction& p, const SlurmOptions& s) {
  const double budget_seconds = 600.0 + 2.0 * static_cast<double>(r.steps) * p.time.step_seconds;
  const std::string time = s.time.empty() ? slurm_time(budget_seconds) : s.time;
  const std::string name =
      sanitize_job_name(s.job_name.empty() ? "ctxrun-" + p.model + "-s" + std::to_string(p.seq) : s.job_name);
  std::ostringstream os;
  os << "#!/bin/bash\n";
  os << "# ctxrun job written by `ctxplan launch` (regenerate rather than edit: the #SBATCH lines follow the plan)\n";
  os << "# model:     " << p.model << "\n";
  os << "# cluster:   " << p.cluster << " (" << c.nodes << " node" << (c.nodes == 1 ? "" : "s") << " x "
     << c.ranks_per_node << " " << p.gpu << ")\n";
  os << "# seq:       " << p.seq << " tokens\n";
  os << "# plan:      " << plan_to_string(p.plan) << " (" << c.world << " ranks)\n";
  os << "# predicted: " << prediction_line(p) << "\n";
  os << "# time:      " << time
     << (s.time.empty() ? " = 10 min start-up + 2 x " + std::to_string(r.steps) + " steps x " + fixed(p.time.step_seconds, 6) +
                              " s predicted, rounded up"
                        : " (--time)")
     << "\n";
  for (auto& w : p.warnings) os << "# warning:   " << w << "\n";
  os << "#SBATCH --job-name=" << name << "\n";
  os << "#SBATCH --nodes=" << c.nodes << "\n";
  os << "#SBATCH --ntasks-per-node=" << c.ranks_per_node << "\n";
  os << "#SBATCH --gpus-per-node=" << c.ranks_per_node << "\n";
  os << "#SBATCH --cpus-per-task=" << r.cpus_per_rank << "\n";
  os << "#SBATCH --exclusive\n";
  os << "#SBATCH --time=" << time << "\n";
  os << "#SBATCH --output=%x-%j.out\n";
  if (!s.partition.empty()) os << "#SBATCH --partition=" << s.partition << "\n";
  if (!s.account.empty()) os << "#SBATCH --account=" << s.account << "\n";
  os << "\nset -euo pipefail\n";
  os << "# CUDA_DEVICE_MAX_CONNECTIONS=1: TP/SP collectives start in the order the compute stream issues them\n";
  os << "# OMP_NUM_THREADS: one thread per core the rank is given (--cpus-per-task)\n";
  os << "# NCCL_DEBUG=WARN: warnings and errors only (INFO to debug the topology)\n";
  for (auto& [k, v] : c.env) os << "export " << k << "=" << shell_quote(v) << "\n";
  os << "\n";
  if (s.launcher == "srun") {
    // srun no longer passes the batch job's --cpus-per-task on to its tasks (Slurm 22.05+): give it again
    const std::string cpu_bind = r.bind == "numa" ? "ldoms" : r.bind == "core" ? "cores" : "none";
    std::vector<std::string> srun = {"srun", "--mpi=pmix", "--ntasks-per-node=" + std::to_string(c.ranks_per_node),
                                     "--cpus-per-task=" + std::to_string(r.cpus_per_rank), "--cpu-bind=" + cpu_bind};
    os << continued({srun, {c.ctxrun_argv.front()}, std::vector<std::string>(c.ctxrun_argv.begin() + 1, c.ctxrun_argv.end())},
                    "  ");
  } else {
    LaunchRequest inside = r;
    inside.local = false;  // mpirun reads the allocation Slurm gave the job
    os << continued(mpirun_lines(inside, c), "  ");
  }
  return os.str();
}

json launch_to_json(const LaunchRequest& r, const LaunchCommand& c, const Prediction& p) {
  json env = json::object();
  for (auto& [k, v] : c.env) env[k] = v;
  return {{"schema", "ctxplan.launch/1"},
          {"model", p.model},
          {"cluster", p.cluster},
          {"seq", p.seq},
          {"plan", plan_to_json(p.plan)},
          {"plan_string", plan_to_string(p.plan)},
          {"world", c.world},
          {"nodes", c.nodes},
          {"ranks_per_node", c.ranks_per_node},
          {"local", r.local},
          {"backend", r.backend},
          {"env", env},
          {"forwarded_env", c.forwarded},
          {"ctxrun_argv", c.ctxrun_argv},
          {"mpirun_argv", c.mpirun_argv},
          {"command", shell_join(c.mpirun_argv)},
          {"prediction",
           {{"runtime", p.runtime},
            {"peak_bytes", p.memory.peak.total()},
            {"capacity_bytes", p.memory.device_capacity_bytes},
            {"fits", p.memory.fits()},
            {"step_seconds", p.time.step_seconds},
            {"tokens_per_second", p.time.tokens_per_second}}},
          {"warnings", p.warnings}};
}

std::string slurm_time(double seconds) {
  const int64_t minutes = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(seconds / 60.0)));
  const int64_t d = minutes / 1440, h = (minutes % 1440) / 60, m = minutes % 60;
  char buf[64];
  if (d > 0) std::snprintf(buf, sizeof buf, "%lld-%02lld:%02lld:00", static_cast<long long>(d), static_cast<long long>(h),
                           static_cast<long long>(m));
  else std::snprintf(buf, sizeof buf, "%02lld:%02lld:00", static_cast<long long>(h), static_cast<long long>(m));
  return buf;
}

std::string shell_quote(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-") ==
                        std::string::npos)
    return w;
  std::string s = "'";
  for (char ch : w) s += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return s + "'";
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i) {
    if (i) s += ' ';
    s += shell_quote(words[i]);
  }
  return s;
}

std::vector<std::string> split_shell_words(const std::string& text, const std::string& where) {
  std::vector<std::string> out;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char ch = text[i];
    if (quote) {
      if (ch == quote) quote = 0;
      else if (ch == '\\' && quote == '"' && i + 1 < text.size()) cur += text[++i];
      else cur += ch;
    } else if (ch == '\'' || ch == '"') {
      quote = ch;
      in_word = true;
    } else if (ch == '\\' && i + 1 < text.size()) {
      cur += text[++i];
      in_word = true;
    } else if (std::isspace(static_cast<unsigned char>(ch))) {
      if (in_word) out.push_back(cur);
      cur.clear();
      in_word = false;
    } else {
      cur += ch;
      in_word = true;
    }
  }
  if (quote) throw InputError(where, "", std::string("unterminated ") + quote + " quote in '" + text + "'");
  if (in_word) out.push_back(cur);
  return out;
}

}  // namespace ctx
