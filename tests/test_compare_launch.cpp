// `ctxplan compare` and `ctxplan launch` through the real binaries: compare on a real ctxrun report
// and a real `ctxplan predict --json` reports exactly the numbers of the two files and the errors
// computed from them; broken files exit 2 naming the file and the field; launch prints an mpirun
// line and a Slurm script whose rank counts follow from the cluster and the plan, refuses a plan
// the cluster cannot hold, and its printed command runs ctxrun under mpirun.
#include <fcntl.h>
#include <gtest/gtest.h>

#include "tests/run_process.hpp"
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "costmodel/exit_codes.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

using ctx::testing::RunResult;
using ctx::testing::slurp;

void write(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

RunResult run(const std::string& bin, const std::vector<std::string>& args) { return ctx::testing::run_process(bin, args); }

RunResult ctxplan(const std::vector<std::string>& args) { return run(CTXPLAN_BIN, args); }

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }
#define EXPECT_HAS(text, needle) EXPECT_TRUE(contains(text, needle)) << "missing \"" << (needle) << "\" in:\n" << (text)

// Bytes as the table writes them: whole bytes with thousands separators (written here, not taken
// from the code under test).
std::string with_commas(double bytes) {
  std::string d = std::to_string(static_cast<long long>(std::llround(bytes))), out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return out;
}

// A scratch folder per test, removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/ctxplan_cmp_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

// A row by section ("memory" or "time") and name: "optimizer" is a memory category and a time phase.
const json* row(const json& cmp, const std::string& section, const std::string& name) {
  for (const json& r : cmp["rows"])
    if (r["section"] == section && r["name"] == name) return &r;
  return nullptr;
}

// The job every compare test uses: tiny at 256 tokens, one rank (ctxrun's default cluster 1x1xh100).
struct OneRankRun {
  TempDir dir;
  std::string pred_path = dir / "pred.json", run_path = dir / "run.json";
  json pred, run;
  bool ok = false;
  OneRankRun() {
#ifdef CTXRUN_BIN
    RunResult r = ::run(CTXRUN_BIN, {"--model", "tiny", "--seq", "256", "--steps", "2", "--report", run_path});
    EXPECT_EQ(r.exit_code, 0) << r.both();
    RunResult p = ctxplan({"predict", "--model", "tiny", "--cluster", "1x1xh100", "--seq", "256", "--plan", "tp=1",
                           "--runtime", "ctxrun-cpu", "--json"});
    EXPECT_EQ(p.exit_code, 0) << p.both();
    write(pred_path, p.out);
    if (r.exit_code != 0 || p.exit_code != 0) return;
    pred = json::parse(p.out);
    run = json::parse(slurp(run_path));
    ok = true;
#endif
  }
};

}  // namespace

// ---- compare ------------------------------------------------------------------------------

TEST(CompareCli, RowsEqualTheInputFilesAndRelativeErrorIsMeasuredOverPredicted) {
#ifndef CTXRUN_BIN
  GTEST_SKIP() << "ctxrun is not built";
#else
  OneRankRun j;
  ASSERT_TRUE(j.ok);
  RunResult r = ctxplan({"compare", j.pred_path, j.run_path, "--json"});
  ASSERT_EQ(r.exit_code, ctx::kExitOk) << r.both();
  json cmp = json::parse(r.out);
  EXPECT_EQ(cmp["schema"], "ctxplan.comparison/1");
  EXPECT_EQ(cmp["prediction_source"], "file");
  const double mem_tol = 0.02, time_tol = 0.10;
  EXPECT_DOUBLE_EQ(cmp["tolerance"]["memory"].get<double>(), mem_tol);
  EXPECT_DOUBLE_EQ(cmp["tolerance"]["time"].get<double>(), time_tol);
  auto check = [&](const std::string& section, const std::string& name, double p, double m, double tol, bool judged) {
    const json* x = row(cmp, section, name);
    ASSERT_NE(x, nullptr) << "no row " << name << " in " << r.out;
    EXPECT_DOUBLE_EQ((*x)["predicted"].get<double>(), p) << name;
    EXPECT_DOUBLE_EQ((*x)["measured"].get<double>(), m) << name;
    EXPECT_DOUBLE_EQ((*x)["abs_error"].get<double>(), m - p) << name;
    if (p != 0) {
      EXPECT_NEAR((*x)["rel_error"].get<double>(), (m - p) / p, 1e-12 * std::max(1.0, std::fabs((m - p) / p))) << name;
      EXPECT_EQ((*x)["miss"].get<bool>(), judged && std::fabs((m - p) / p) > tol) << name;
    }
    EXPECT_EQ((*x)["judged"].get<bool>(), judged) << name;
  };
  // memory: every category either side has, at the peak instant; the single rank is the peak rank
  int categories = 0;
  for (auto& [cat, pv] : j.pred["memory"]["by_category"].items()) {
    double p = pv.get<double>(), m = j.run["memory"]["by_category"][cat].get<double>();
    if (p == 0 && m == 0) {
      EXPECT_EQ(row(cmp, "memory", cat), nullptr) << cat << " is zero on both sides and should be left out";
      continue;
    }
    check("memory", cat, p, m, mem_tol, true);
    ++categories;
  }
  EXPECT_GE(categories, 5);
  check("memory", "total (peak)", j.pred["memory"]["peak_bytes"], j.run["memory"]["peak_bytes"], mem_tol, true);
  // time: forward+backward pairs the prediction's two phases with ctxrun's three
  const json& pt = j.pred["time"]["phases_seconds"];
  const json& mt = j.run["ranks"][0]["time"]["phases"];
  check("time", "forward+backward", pt["forward"].get<double>() + pt["backward"].get<double>(),
        mt["forward"].get<double>() + mt["loss"].get<double>() + mt["backward"].get<double>(), time_tol, true);
  check("time", "optimizer", pt["optimizer"], mt["optimizer"], time_tol, true);
  check("time", "step", j.pred["time"]["step_seconds"], j.run["ranks"][0]["time"]["step_seconds"], time_tol, true);
  check("time", "tokens/s", j.pred["time"]["tokens_per_second"], j.run["time"]["tokens_per_second"], time_tol, true);
  check("time", "~backward", pt["backward"], mt["loss"].get<double>() + mt["backward"].get<double>(), time_tol, false);
  int misses = 0, judged = 0;
  for (const json& x : cmp["rows"]) {
    misses += x["miss"].get<bool>();
    judged += x["judged"].get<bool>();
  }
  EXPECT_EQ(cmp["misses"].get<int>(), misses);
  EXPECT_EQ(cmp["judged"].get<int>(), judged);
  EXPECT_FALSE(cmp["mapping"].empty());

  // the table prints the same bytes, exactly
  RunResult t = ctxplan({"compare", j.pred_path, j.run_path});
  ASSERT_EQ(t.exit_code, ctx::kExitOk) << t.both();
  std::istringstream lines(t.out);
  std::string line;
  bool saw_weights = false;
  while (std::getline(lines, line)) {
    if (line.rfind("  weights ", 0) != 0) continue;
    saw_weights = true;
    EXPECT_HAS(line, with_commas(j.pred["memory"]["by_category"]["weights"].get<double>()));
    EXPECT_HAS(line, with_commas(j.run["memory"]["by_category"]["weights"].get<double>()));
  }
  EXPECT_TRUE(saw_weights) << t.out;
  EXPECT_HAS(t.out, "Mapping:");
  EXPECT_HAS(t.out, "forward+backward");
#endif
}

TEST(CompareCli, OneFileComparesWithThePredictionTheReportEmbeds) {
#ifndef CTXRUN_BIN
  GTEST_SKIP() << "ctxrun is not built";
#else
  OneRankRun j;
  ASSERT_TRUE(j.ok);
  RunResult r = ctxplan({"compare", j.run_path, "--json"});
  ASSERT_EQ(r.exit_code, ctx::kExitOk) << r.both();
  json cmp = json::parse(r.out);
  EXPECT_EQ(cmp["prediction_source"], "embedded");
  const json* w = row(cmp, "memory", "weights");
  ASSERT_NE(w, nullptr);
  EXPECT_DOUBLE_EQ((*w)["predicted"].get<double>(), j.run["prediction"]["memory"]["by_category"]["weights"].get<double>());
  const json* total = row(cmp, "memory", "total (peak)");
  ASSERT_NE(total, nullptr);
  EXPECT_DOUBLE_EQ((*total)["predicted"].get<double>(), j.run["prediction"]["memory"]["peak_bytes"].get<double>());
#endif
}

TEST(CompareCli, FailOverToleranceExitsNonZeroOnlyWhenAsked) {
#ifndef CTXRUN_BIN
  GTEST_SKIP() << "ctxrun is not built";
#else
  OneRankRun j;
  ASSERT_TRUE(j.ok);
  // a CPU run against a GPU prediction misses on time whatever the tolerance
  RunResult plain = ctxplan({"compare", j.pred_path, j.run_path, "--time-tol", "1"});
  EXPECT_EQ(plain.exit_code, ctx::kExitOk) << plain.both();
  EXPECT_HAS(plain.out, "MISS");
  RunResult strict = ctxplan({"compare", j.pred_path, j.run_path, "--time-tol", "1", "--fail-over-tol"});
  EXPECT_EQ(strict.exit_code, ctx::kExitOverTolerance) << strict.both();
  EXPECT_HAS(strict.out, "OVER TOLERANCE");
  RunResult bad = ctxplan({"compare", j.pred_path, j.run_path, "--mem-tol", "two"});
  EXPECT_EQ(bad.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(bad.err, "--mem-tol");
#endif
}

TEST(CompareCli, BrokenFilesNameTheFileAndTheField) {
#ifndef CTXRUN_BIN
  GTEST_SKIP() << "ctxrun is not built";
#else
  OneRankRun j;
  ASSERT_TRUE(j.ok);
  const TempDir& d = j.dir;
  auto expect_bad = [&](const std::vector<std::string>& args, const std::vector<std::string>& needles) {
    std::vector<std::string> a = {"compare"};
    a.insert(a.end(), args.begin(), args.end());
    RunResult r = ctxplan(a);
    EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
    for (auto& n : needles) EXPECT_HAS(r.err, n);
  };
  // missing file, not JSON, a folder
  expect_bad({j.pred_path, d / "nope.json"}, {d / "nope.json", "cannot open"});
  write(d / "garbage.json", "{\"schema\": \"ctxplan.measurement/1\",\n  \"memory\": [1, 2,\n");
  expect_bad({j.pred_path, d / "garbage.json"}, {d / "garbage.json", "malformed JSON"});
  expect_bad({d.path, j.run_path}, {d.path, "folder"});
  // wrong schema, and the two files swapped
  json s = j.run;
  s["schema"] = "ctxplan.measurement/7";
  write(d / "schema.json", s.dump());
  expect_bad({j.pred_path, d / "schema.json"}, {d / "schema.json", "'schema'", "ctxplan.measurement/1", "ctxplan.measurement/7"});
  expect_bad({j.run_path, j.pred_path}, {j.pred_path, "'schema'", "ctxplan.measurement/1"});
  json ps = j.pred;
  ps["schema"] = "ctxplan.search/1";
  write(d / "pred_schema.json", ps.dump());
  expect_bad({d / "pred_schema.json", j.run_path}, {d / "pred_schema.json", "'schema'", "ctxplan.prediction/1"});
  // a missing field, a field of the wrong type, in either file
  json m = j.run;
  m["memory"]["by_category"].erase("weights");
  write(d / "missing.json", m.dump());
  expect_bad({j.pred_path, d / "missing.json"}, {d / "missing.json", "memory.by_category.weights", "missing", "bytes"});
  json t = j.run;
  t["ranks"][0]["time"]["phases"]["loss"] = "fast";
  write(d / "type.json", t.dump());
  expect_bad({j.pred_path, d / "type.json"}, {d / "type.json", "ranks[0].time.phases.loss", "seconds", "\"fast\""});
  json pm = j.pred;
  pm["time"].erase("phases_seconds");
  write(d / "pred_missing.json", pm.dump());
  expect_bad({d / "pred_missing.json", j.run_path}, {d / "pred_missing.json", "time.phases_seconds", "forward, backward, optimizer"});
  // files that describe different jobs; --allow-mismatch compares anyway, with a warning
  json q = j.run;
  q["seq"] = 512;
  write(d / "seq.json", q.dump());
  expect_bad({j.pred_path, d / "seq.json"}, {d / "seq.json", "seq", "256", "512", "--allow-mismatch"});
  RunResult forced = ctxplan({"compare", j.pred_path, d / "seq.json", "--allow-mismatch"});
  EXPECT_EQ(forced.exit_code, ctx::kExitOk) << forced.both();
  EXPECT_HAS(forced.out, "warning: different jobs: seq");
  // a rank the report does not have
  expect_bad({j.pred_path, j.run_path, "--rank", "3"}, {"--rank", "valid: 0..0"});
#endif
}

// ---- launch -------------------------------------------------------------------------------

TEST(LaunchCli, CommandRunsOneRankPerGpuPackedByNode) {
  // 2 nodes x 4 GPUs; tp=2, cp=2 leaves dp=2: 8 ranks, 4 per node
  RunResult r = ctxplan({"launch", "--model", "tiny", "--cluster", "2x4xh100", "--seq", "256", "--plan", "tp=2,cp=2",
                         "--steps", "7", "--report", "out.json"});
  ASSERT_EQ(r.exit_code, ctx::kExitOk) << r.both();
  EXPECT_HAS(r.out, "mpirun -np 8 ");
  EXPECT_HAS(r.out, "--map-by ppr:4:node");
  EXPECT_HAS(r.out, "--bind-to numa");
  EXPECT_HAS(r.out, "-x CUDA_DEVICE_MAX_CONNECTIONS=1");
  EXPECT_HAS(r.out, "-x OMP_NUM_THREADS=8");
  EXPECT_HAS(r.out, "--plan dp=2,tp=2,cp=2");
  EXPECT_HAS(r.out, "--steps 7");
  EXPECT_HAS(r.out, "--report out.json");
  EXPECT_HAS(r.out, "--cluster 2x4xh100");

  RunResult js = ctxplan({"launch", "--model", "tiny", "--cluster", "2x4xh100", "--seq", "256", "--plan", "tp=2,cp=2",
                          "--bind", "core", "--cpus-per-rank", "6", "--json"});
  ASSERT_EQ(js.exit_code, ctx::kExitOk) << js.both();
  json j = json::parse(js.out);
  EXPECT_EQ(j["world"], 8);
  EXPECT_EQ(j["nodes"], 2);
  EXPECT_EQ(j["ranks_per_node"], 4);
  std::vector<std::string> argv = j["mpirun_argv"];
  auto after = [&](const std::string& flag) {
    for (size_t i = 0; i + 1 < argv.size(); ++i)
      if (argv[i] == flag) return argv[i + 1];
    return std::string("(no ") + flag + ")";
  };
  EXPECT_EQ(after("-np"), "8");
  EXPECT_EQ(after("--map-by"), "ppr:4:node:PE=6");
  EXPECT_EQ(after("--bind-to"), "core");
  EXPECT_EQ(j["env"]["OMP_NUM_THREADS"], "6");
  // ctxrun's argument list is the tail of the mpirun line
  std::vector<std::string> ctxrun = j["ctxrun_argv"];
  ASSERT_LE(ctxrun.size(), argv.size());
  EXPECT_TRUE(std::equal(ctxrun.begin(), ctxrun.end(), argv.end() - static_cast<long>(ctxrun.size())));
}

// The ctxrun argument after `flag` in a launch --json answer ("(no flag)" when absent).
std::string ctxrun_arg(const RunResult& r, const std::string& flag) {
  std::vector<std::string> argv = json::parse(r.out)["ctxrun_argv"];
  for (size_t i = 0; i + 1 < argv.size(); ++i)
    if (argv[i] == flag) return argv[i + 1];
  return "(no " + flag + ")";
}

TEST(LaunchCli, GpuClusterLaunchesTheCudaBackendUnlessToldCpu) {
  const std::vector<std::string> job = {"launch", "--model", "tiny", "--cluster", "1x2xh100", "--seq", "256", "--plan", "tp=2"};
  // an H100 cluster: the CUDA backend, in the printed line and in --json, predicted with its profile
  RunResult text = ctxplan(job);
  ASSERT_EQ(text.exit_code, ctx::kExitOk) << text.both();
  EXPECT_HAS(text.out, "--backend cuda");
  EXPECT_HAS(text.out, "(runtime ctxrun-cuda)");
  std::vector<std::string> js = job;
  js.push_back("--json");
  RunResult cuda = ctxplan(js);
  ASSERT_EQ(cuda.exit_code, ctx::kExitOk) << cuda.both();
  EXPECT_EQ(ctxrun_arg(cuda, "--backend"), "cuda");
  EXPECT_EQ(json::parse(cuda.out)["prediction"]["runtime"], "ctxrun-cuda");
  // --backend cpu: the CPU backend, predicted with ctxrun-cpu
  js.insert(js.end(), {"--backend", "cpu"});
  RunResult cpu = ctxplan(js);
  ASSERT_EQ(cpu.exit_code, ctx::kExitOk) << cpu.both();
  EXPECT_EQ(ctxrun_arg(cpu, "--backend"), "cpu");
  EXPECT_EQ(json::parse(cpu.out)["prediction"]["runtime"], "ctxrun-cpu");
  // the Slurm script runs the same line
  TempDir d;
  std::vector<std::string> slurm = job;
  slurm.insert(slurm.end(), {"--slurm", d / "job.sbatch"});
  ASSERT_EQ(ctxplan(slurm).exit_code, ctx::kExitOk);
  EXPECT_HAS(slurp(d / "job.sbatch"), "--backend cuda");
  // anything else is refused naming the flag and the valid values
  std::vector<std::string> bad = job;
  bad.insert(bad.end(), {"--backend", "gpu"});
  RunResult b = ctxplan(bad);
  EXPECT_EQ(b.exit_code, ctx::kExitBadInput) << b.both();
  EXPECT_HAS(b.err, "--backend");
  EXPECT_HAS(b.err, "cuda or cpu");
  EXPECT_EQ(b.out, "");
}

TEST(LaunchCli, PlanPrecisionPassesThroughUnchanged) {
  RunResult r = ctxplan({"launch", "--model", "tiny", "--cluster", "1x2xh100", "--seq", "256", "--plan", "tp=2,precision=fp32",
                         "--json"});
  ASSERT_EQ(r.exit_code, ctx::kExitOk) << r.both();
  EXPECT_EQ(ctxrun_arg(r, "--plan"), "dp=1,tp=2,cp=1,precision=fp32");
}

TEST(LaunchCli, SlurmScriptFollowsThePlanAndCarriesThePrediction) {
  TempDir d;
  const std::string script = d / "job.sbatch";
  // 4 nodes x 8 GPUs, tp=8 x cp=4 = 32 ranks: nodes = 32 / 8
  const std::vector<std::string> job = {"--model", "Llama-3.1-8B", "--cluster", "4x8xh100", "--seq", "256k", "--plan",
                                        "tp=8,cp=4,zero=1,recompute=full"};
  std::vector<std::string> args = {"launch", "--slurm", script, "--steps", "50", "--partition", "gpu", "--cpus-per-rank", "12"};
  args.insert(args.end(), job.begin(), job.end());
  RunResult r = ctxplan(args);
  ASSERT_EQ(r.exit_code, ctx::kExitOk) << r.both();
  std::string s = slurp(script);
  EXPECT_EQ(s.rfind("#!/bin/bash\n", 0), 0u) << s;
  EXPECT_HAS(s, "#SBATCH --nodes=4\n");
  EXPECT_HAS(s, "#SBATCH --ntasks-per-node=8\n");
  EXPECT_HAS(s, "#SBATCH --gpus-per-node=8\n");
  EXPECT_HAS(s, "#SBATCH --cpus-per-task=12\n");
  EXPECT_HAS(s, "#SBATCH --exclusive\n");
  EXPECT_HAS(s, "#SBATCH --time=");
  EXPECT_HAS(s, "#SBATCH --job-name=ctxrun-Llama-3.1-8B-s262144\n");
  EXPECT_HAS(s, "#SBATCH --partition=gpu\n");
  EXPECT_HAS(s, "export CUDA_DEVICE_MAX_CONNECTIONS=1\n");
  EXPECT_HAS(s, "export OMP_NUM_THREADS=12\n");
  EXPECT_HAS(s, "srun --mpi=pmix");
  EXPECT_HAS(s, "--cpus-per-task=12");
  // the header names the plan and the prediction of `ctxplan predict` for the same job
  std::vector<std::string> pargs = {"predict", "--json"};
  pargs.insert(pargs.end(), job.begin(), job.end());
  RunResult p = ctxplan(pargs);
  ASSERT_EQ(p.exit_code, ctx::kExitOk) << p.both();
  json pred = json::parse(p.out);
  EXPECT_HAS(s, "# plan:      " + pred["plan_string"].get<std::string>() + " (32 ranks)");
  char step[64];
  std::snprintf(step, sizeof step, "step %.6f s", pred["time"]["step_seconds"].get<double>());
  EXPECT_HAS(s, step);
  EXPECT_HAS(s, "--plan " + pred["plan_string"].get<std::string>());
  // every #SBATCH line comes before the first command (sbatch stops reading them there)
  size_t last_sbatch = s.rfind("#SBATCH"), first_cmd = s.find("\nset -euo");
  EXPECT_LT(last_sbatch, first_cmd);
  // written atomically: nothing but the script in the folder
  int files = 0;
  for (auto& e : fs::directory_iterator(d.path)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);

  // --launcher mpirun puts the same mpirun line inside the script
  RunResult m = ctxplan({"launch", "--slurm", script, "--launcher", "mpirun", "--model", "tiny", "--cluster", "2x4xh100",
                         "--seq", "256", "--plan", "tp=4"});
  ASSERT_EQ(m.exit_code, ctx::kExitOk) << m.both();
  std::string ms = slurp(script);
  EXPECT_HAS(ms, "#SBATCH --nodes=2\n");
  EXPECT_HAS(ms, "#SBATCH --ntasks-per-node=4\n");
  EXPECT_HAS(ms, "mpirun -np 8 --map-by ppr:4:node");
}

TEST(LaunchCli, RefusesAPlanTheClusterCannotHold) {
  // dp=1,tp=2 is 2 ranks; the cluster has 8 GPUs
  RunResult r = ctxplan({"launch", "--model", "tiny", "--cluster", "8xh100", "--seq", "256", "--plan", "dp=1,tp=2"});
  EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
  EXPECT_HAS(r.err, "--plan");
  EXPECT_HAS(r.err, "2 ranks");
  EXPECT_HAS(r.err, "8 GPUs");
  EXPECT_HAS(r.err, "dp=4");
  EXPECT_EQ(r.out, "");
  // tp=2 does not divide 3 GPUs
  RunResult odd = ctxplan({"launch", "--model", "tiny", "--cluster", "1x3xh100", "--seq", "256", "--plan", "tp=2"});
  EXPECT_EQ(odd.exit_code, ctx::kExitBadInput) << odd.both();
  EXPECT_HAS(odd.err, "3 GPUs");
  // a plan that does not fit in memory: exit 3, as ctxrun would
  RunResult big = ctxplan({"launch", "--model", "Llama-3.1-70B", "--cluster", "1x1xh100", "--seq", "1m", "--plan", "tp=1"});
  EXPECT_EQ(big.exit_code, ctx::kExitDoesNotFit) << big.both();
  EXPECT_HAS(big.err, "does not fit");
  // no plan at all
  RunResult none = ctxplan({"launch", "--model", "tiny"});
  EXPECT_EQ(none.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(none.err, "--plan-file");
}

TEST(LaunchCli, BadPlanFilesNameTheFileAndTheField) {
  TempDir d;
  auto expect_bad = [&](const std::string& name, const std::string& text, const std::vector<std::string>& needles) {
    write(d / name, text);
    RunResult r = ctxplan({"launch", "--plan-file", d / name});
    EXPECT_EQ(r.exit_code, ctx::kExitBadInput) << r.both();
    EXPECT_HAS(r.err, d / name);
    for (auto& n : needles) EXPECT_HAS(r.err, n);
  };
  expect_bad("syntax.json", "{\"schema\": \"ctxplan.plan/1\", \"plan\": {\"tp\": 2,}}", {"malformed JSON"});
  expect_bad("schema.json", "{\"schema\": \"ctxplan.plan/9\", \"plan\": {\"tp\": 2}}",
             {"'schema'", "ctxplan.plan/1", "ctxplan.search/1", "ctxplan.plan/9"});
  expect_bad("noschema.json", "{\"plan\": {\"tp\": 2}}", {"'schema'", "missing"});
  expect_bad("noplan.json", "{\"schema\": \"ctxplan.plan/1\", \"model\": \"tiny\"}", {"'plan'", "missing"});
  expect_bad("key.json", "{\"schema\": \"ctxplan.plan/1\", \"model\": \"tiny\", \"plan\": {\"tp\": \"two\"}}", {"tp", "two"});
  expect_bad("empty_search.json", "{\"schema\": \"ctxplan.search/1\", \"model\": \"tiny\", \"top\": [], \"no_fit\": \"too big\"}",
             {"'top'", "no plan that fits", "too big"});
  RunResult missing = ctxplan({"launch", "--plan-file", d / "absent.json"});
  EXPECT_EQ(missing.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(missing.err, d / "absent.json");
}

TEST(LaunchCli, AcceptsTheGuiExportAndTheSearchOutput) {
  TempDir d;
  // the GUI's export (ctxplan.plan/1): ctxrun reads the same file
  write(d / "plan.json",
        R"({"schema": "ctxplan.plan/1", "model": "tiny", "cluster": "1x2xh100", "seq": 256, "runtime": "ctxrun-cuda", "plan": {"tp": 2}})");
  RunResult g = ctxplan({"launch", "--plan-file", d / "plan.json", "--json"});
  ASSERT_EQ(g.exit_code, ctx::kExitOk) << g.both();
  json gj = json::parse(g.out);
  EXPECT_EQ(gj["world"], 2);
  std::vector<std::string> gargv = gj["ctxrun_argv"];
  auto has_pair = [](const std::vector<std::string>& v, const std::string& a, const std::string& b) {
    for (size_t i = 0; i + 1 < v.size(); ++i)
      if (v[i] == a && v[i + 1] == b) return true;
    return false;
  };
  EXPECT_TRUE(has_pair(gargv, "--plan-file", fs::absolute(d / "plan.json").string())) << g.out;
  EXPECT_TRUE(has_pair(gargv, "--seq", "256")) << g.out;
  EXPECT_TRUE(has_pair(gargv, "--model", "tiny")) << g.out;
  // `ctxplan plan --json`: --pick chooses among the ranked plans
  RunResult s = ctxplan({"plan", "--model", "tiny", "--cluster", "1x2xh100", "--seq", "256", "--json"});
  ASSERT_EQ(s.exit_code, ctx::kExitOk) << s.both();
  write(d / "plans.json", s.out);
  json plans = json::parse(s.out);
  ASSERT_GE(plans["top"].size(), 2u);
  RunResult second = ctxplan({"launch", "--plan-file", d / "plans.json", "--pick", "2", "--json"});
  ASSERT_EQ(second.exit_code, ctx::kExitOk) << second.both();
  EXPECT_EQ(json::parse(second.out)["plan_string"], plans["top"][1]["plan_string"]);
  RunResult beyond = ctxplan({"launch", "--plan-file", d / "plans.json", "--pick", "99"});
  EXPECT_EQ(beyond.exit_code, ctx::kExitBadInput);
  EXPECT_HAS(beyond.err, "--pick");
}

TEST(LaunchCli, PrintedCommandRunsCtxrunUnderMpirun) {
#if !defined(CTXRUN_BIN) || !defined(MPIRUN)
  GTEST_SKIP() << "ctxrun or MPI is not built";
#else
  TempDir d;
  const std::string report = d / "run.json";
  std::vector<std::string> args = {"launch", "--model", "tiny", "--cluster", "1x2xh100", "--seq", "256", "--plan", "tp=2",
                                   "--steps", "2", "--report", report, "--local", "--backend", "cpu", "--ctxrun", CTXRUN_BIN,
                                   "--mpirun", MPIRUN};
  if (geteuid() == 0) args.push_back("--mpi-extra=--allow-run-as-root");
  RunResult l = ctxplan(args);
  ASSERT_EQ(l.exit_code, ctx::kExitOk) << l.both();
  EXPECT_HAS(l.out, "-np 2 ");
  EXPECT_HAS(l.out, "ppr:2:node");
  // exactly what was printed, through a shell
  RunResult sh = run("/bin/bash", {"-c", l.out});
  ASSERT_EQ(sh.exit_code, 0) << l.out << "\n" << sh.both();
  json rep = json::parse(slurp(report));
  EXPECT_EQ(rep["schema"], "ctxplan.measurement/1");
  EXPECT_EQ(rep["world"], 2);
  EXPECT_EQ(rep["plan_string"], "dp=1,tp=2,cp=1");
  EXPECT_EQ(rep["losses"].size(), 2u);
  // and compare reads that report, rank by rank
  RunResult c = ctxplan({"compare", report, "--rank", "1", "--json"});
  ASSERT_EQ(c.exit_code, ctx::kExitOk) << c.both();
  json cmp = json::parse(c.out);
  EXPECT_EQ(cmp["memory_rank"], 1);
  const json* act = row(cmp, "memory", "activations");
  ASSERT_NE(act, nullptr);
  EXPECT_DOUBLE_EQ((*act)["measured"].get<double>(), rep["ranks"][1]["memory"]["by_category"]["activations"].get<double>());
#endif
}
