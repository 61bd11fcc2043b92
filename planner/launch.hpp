// `ctxplan launch`: turns a plan into the command that runs it with ctxrun: the mpirun line (one
// rank per GPU, ranks packed node by node, bound near their GPU, the environment NCCL and the CPU
// threads need) and, optionally, a Slurm batch script with the prediction in its header.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "costmodel/prediction.hpp"

namespace ctx {

struct LaunchRequest {
  ModelSpec model;
  ClusterSpec cluster;
  Plan plan;                      // dp resolved
  int64_t seq = 0;
  std::string model_arg;          // what ctxrun gets for --model (a profile name or an absolute path)
  std::string cluster_arg;        // ... for --cluster
  std::string profiles_dir;       // ... for --profiles (absolute)
  std::string plan_file;          // absolute ctxplan.plan/1 file for --plan-file; empty: --plan <text>
  std::string ctxrun = "ctxrun";  // the executable the ranks run
  std::string backend = "cuda";   // ctxrun --backend: cpu | cuda
  std::string mpirun = "mpirun";
  std::string report;             // ctxrun --report (empty: none)
  int64_t steps = 20;
  int64_t cpus_per_rank = 8;      // cores (and OMP threads) per rank
  std::string bind = "numa";      // numa | core | none
  bool local = false;             // more ranks than cores or GPUs here: --oversubscribe, no binding
  bool no_fit_check = false;      // ctxrun --no-fit-check
  std::vector<std::string> ctxrun_extra, mpirun_extra;
  std::vector<std::string> env;   // extra KEY=VALUE exported to every rank
};

struct LaunchCommand {
  int64_t world = 0, nodes = 0, ranks_per_node = 0;
  std::vector<std::pair<std::string, std::string>> env;  // exported to every rank, with why (see launch.cpp)
  std::vector<std::string> forwarded;                    // names forwarded from the caller's environment
  std::vector<std::string> ctxrun_argv;                  // ctxrun and its arguments
  std::vector<std::string> mpirun_argv;                  // the whole mpirun command line
};

struct SlurmOptions {
  std::string job_name;           // empty: ctxrun-<model>-s<seq>
  std::string time;               // empty: 10 minutes + twice the predicted steps
  std::string partition, account;
  std::string launcher = "srun";  // srun (--mpi=pmix) or mpirun
};

// Throws InputError (where = the plan's source) unless dp*tp*cp equals the cluster's GPUs, naming
// the valid dp and a cluster the plan would fill.
void check_launch_world(const Plan& p, const ClusterSpec& c, const std::string& where);

LaunchCommand make_launch_command(const LaunchRequest& r);

// The command as a shell would run it: comment lines (#) with the job and the prediction, then
// the command with one backslash-continued line per group of options.
std::string launch_text(const LaunchRequest& r, const LaunchCommand& cmd, const Prediction& p);
std::string slurm_script(const LaunchRequest& r, const LaunchCommand& cmd, const Prediction& p, const SlurmOptions& s);
json launch_to_json(const LaunchRequest& r, const LaunchCommand& cmd, const Prediction& p);

// Slurm's [D-]HH:MM:SS for a wall-clock budget, rounded up to whole minutes.
std::string slurm_time(double seconds);
// Quoting for a POSIX shell: the word unchanged when it is safe, else in single quotes.
std::string shell_quote(const std::string& word);
std::string shell_join(const std::vector<std::string>& words);
// Splits "--lr 1e-3 --data 'my file.bin'" into words (single and double quotes, backslash escapes).
std::vector<std::string> split_shell_words(const std::string& text, const std::string& where);

}  // namespace ctx
