#include "executor/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <filesystem>
#include <fstream>
#include <functional>

#include "costmodel/errors.hpp"
#include "costmodel/json_util.hpp"
#include "costmodel/profile_store.hpp"
#include "executor/safetensors.hpp"

namespace fs = std::filesystem;

namespace ctx::exec {
namespace {

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd >= 0) { ::fsync(fd); ::close(fd); }
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error("cannot write " + tmp);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) throw std::runtime_error("write failed: " + tmp);
  }
  fsync_path(tmp);
  fs::rename(tmp, path);
  fsync_path(fs::path(path).parent_path().string());
}

// The largest step a checkpoint may name: far beyond any run, small enough that step arithmetic
// (learning-rate schedule, step + 1) cannot overflow.
constexpr int64_t kMaxCheckpointStep = int64_t(1) << 40;

// The index's step: a non-negative integer; anything else is a damaged index (exit 2), never a
// default (a negative step trained with a negative learning rate and exited 0).
int64_t checkpoint_step(const json& info, const std::string& index) {
  return JsonReader(info, index).integer_in("step", 0, kMaxCheckpointStep);
}

// Schema ctxrun.checkpoint/1 (before sharded checkpoints): full tensors in model.safetensors and
// optimizer.safetensors, readable under any plan.
int64_t load_consolidated(Trainer& t, const std::string& ck, const json& info) {
  std::map<std::string, std::vector<int64_t>> shapes;
  TensorMap w = read_safetensors(ck + "/model.safetensors", &shapes);
  for (auto& [name, shape] : t.params().full_shapes()) {
    auto it = shapes.find(name);
    std::string want;
    for (auto d : shape) want += std::string(want.empty() ? "" : "x") + std::to_string(d);
    if (it == shapes.end())
      throw InputError(ck + "/model.safetensors", name,
                       "missing: the checkpoint is not of model " + t.options().model.name + " (needs " + want + ")");
    if (it->second != shape) {
      std::string got;
      for (auto d : it->second) got += std::string(got.empty() ? "" : "x") + std::to_string(d);
      throw InputError(ck + "/model.safetensors", name,
                       "shape " + got + " does not match model " + t.options().model.name + " (" + want + ")");
    }
  }
  TensorMap o = read_safetensors(ck + "/optimizer.safetensors");
  TensorMap m, v;
  for (auto& [name, shape] : t.params().full_shapes()) {
    auto a = o.find("exp_avg." + name), b = o.find("exp_avg_sq." + name);
    if (a == o.end() || b == o.end()) throw InputError(ck + "/optimizer.safetensors", name, "Adam moments missing");
    m[name] = std::move(a->second);
    v[name] = std::move(b->second);
  }
  t.params().load_full("master", w, ck + "/model.safetensors");
  t.params().load_full("m", m, ck + "/optimizer.safetensors");
  t.params().load_full("v", v, ck + "/optimizer.safetensors");
  const int64_t step = checkpoint_step(info, ck + "/trainer.json");
  t.set_steps_done(step);
  return step;
}

constexpr const char* kSchema = "ctxrun.checkpoint/2";
constexpr const char* kShardSchema = "ctxrun.shard/1";
const char* const kKinds[3] = {"master", "m", "v"};
const char* const kTensorKinds[3] = {"master", "exp_avg", "exp_avg_sq"};

std::string rank_file(int64_t rank) {
  char b[40];
  std::snprintf(b, sizeof(b), "rank-%05lld.safetensors", static_cast<long long>(rank));
  return b;
}

std::string unit_tensor(size_t u, int k) {
  char b[48];
  std::snprintf(b, sizeof(b), "unit.%04zu.%s", u, kTensorKinds[k]);
  return b;
}

// What decides which floats a rank holds: resuming needs all of it unchanged.
json sharding_of(const ParallelContext& pc) {
  const Plan& p = pc.plan;
  json s = {{"world", pc.world}, {"tp", p.tp},   {"cp", p.cp},
            {"dp", p.dp},        {"zero", p.zero}, {"ulysses", ulysses_degree(p)}};
  if (zero_replicate_degree(p) > 1) s["zero_shard"] = zero_shard_degree(p);  // HSDP only: older checkpoints keep their sharding
  return s;
}

std::string sharding_text(const json& s) {
  std::string out;
  for (const char* k : {"tp", "cp", "dp", "zero", "zero_shard", "ulysses"})
    out += (out.empty() ? "" : ",") + std::string(k) + "=" + (s.contains(k) ? json_excerpt(s[k]) : "?");
  return out + " on " + (s.contains("world") ? json_excerpt(s["world"]) : "?") + " ranks";
}

// The model's architecture without its name and description.
json architecture(json m) {
  for (const char* k : {"schema", "name", "source", "aliases"}) m.erase(k);
  return m;
}

json units_of(const ParamStore& ps) {
  json units = json::array();
  for (auto& u : ps.units)
    units.push_back({{"name", u.name}, {"numel", u.numel}, {"padded", u.padded}, {"shard", u.shard},
                     {"shard_offset", u.shard_offset}});
  return units;
}

json shard_metadata(Trainer& t) {
  const ParallelContext& pc = t.context();
  return {{"schema", kShardSchema},
          {"step", t.steps_done()},
          {"rank", pc.rank},
          {"coord", {{"tp", pc.coord.tp}, {"cp", pc.coord.cp}, {"dp", pc.coord.dp}}},
          {"zero_rank", pc.zero->rank()},
          {"zero_size", pc.zero->size()},
          {"sharding", sharding_of(pc)},
          {"plan", plan_to_string(pc.plan)},
          {"model", t.options().model.name},
          {"units", units_of(t.params())}};
}

// Fails (InputError naming `file`) unless the shard file was written by this rank of this plan.
void check_shard(Trainer& t, const std::string& file, const json& meta, int64_t step) {
  const json mine = shard_metadata(t);
  if (!meta.is_object()) throw InputError(file, "__metadata__.ctxrun", "expected an object, got " + json_excerpt(meta));
  auto differs = [&](const char* key) { return !meta.contains(key) || meta[key] != mine[key]; };
  if (differs("schema"))
    throw InputError(file, "__metadata__", "not a ctxrun shard file (schema " +
                                               (meta.contains("schema") ? json_excerpt(meta["schema"]) : "missing") + ")");
  if (!meta.contains("step") || meta["step"] != json(step))
    throw InputError(file, "step", "holds step " + (meta.contains("step") ? json_excerpt(meta["step"]) : "(none)") +
                                       " but the index says " + std::to_string(step) + " (mixed checkpoints?)");
  if (differs("sharding"))
    throw InputError(file, "sharding", "written under " + sharding_text(meta.contains("sharding") ? meta["sharding"] : json::object()) +
                                           ", this run is " + sharding_text(mine["sharding"]));
  for (const char* k : {"rank", "coord", "zero_rank", "zero_size"})
    if (differs(k))
      throw InputError(file, k, "belongs to " + std::string(k) + " " + (meta.contains(k) ? json_excerpt(meta[k]) : "(none)") +
                                    ", this rank has " + mine[k].dump());
  if (differs("units")) {
    const json a = meta.contains("units") && meta["units"].is_array() ? meta["units"] : json::array();
    const json& b = mine["units"];
    std::string why = "holds " + std::to_string(a.size()) + " units, the model has " + std::to_string(b.size());
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (a[i] != b[i]) {
        why = "unit " + std::to_string(i) + " is " + json_excerpt(a[i]) + " in the file, " + b[i].dump() + " here";
        break;
      }
    throw InputError(file, "units", why);
  }
}

}  // namespace

std::string save_checkpoint(Trainer& t, const std::string& dir, const json& run_info) {
  ParamStore& ps = t.params();
  ParallelContext& pc = t.context();
  const bool root = pc.rank == 0;
  char name[32];
  std::snprintf(name, sizeof(name), "step-%06lld", static_cast<long long>(t.steps_done()));
  const std::string final_dir = (fs::path(dir) / name).string();
  const std::string tmp_dir = final_dir + ".tmp";
  // this rank's own state only: no gather
  ShapeList order;
  TensorMap tensors;
  for (size_t u = 0; u < ps.units.size(); ++u)
    for (int k = 0; k < 3; ++k) {
      order.push_back({unit_tensor(u, k), {ps.units[u].shard}});
      tensors[unit_tensor(u, k)] = ps.download_shard(static_cast<int64_t>(u), kKinds[k]);
    }
  if (root) {
    fs::create_directories(dir);
    fs::remove_all(tmp_dir);  // a save that died before its rename
    fs::create_directories(tmp_dir);
  }
  pc.world_comm->barrier();
  write_file_atomic((fs::path(tmp_dir) / rank_file(pc.rank)).string(),
                    safetensors_bytes(order, tensors, {{"ctxrun", shard_metadata(t).dump()}}));
  tensors.clear();
  pc.world_comm->barrier();  // every shard is on disk
  if (root) {
    json info = run_info;
    info["schema"] = kSchema;
    info["step"] = t.steps_done();
    info["model"] = model_to_json(t.options().model);
    info["sharding"] = sharding_of(pc);
    info["units"] = units_of(ps);
    json files = json::array();
    for (int64_t r = 0; r < pc.world; ++r) {
      RankCoord c = coord_of_rank(pc.plan, r);
      files.push_back({{"file", rank_file(r)}, {"rank", r}, {"tp", c.tp}, {"cp", c.cp}, {"dp", c.dp}});
    }
    info["files"] = files;
    write_file_atomic(tmp_dir + "/trainer.json", info.dump(2));
    // the same step saved again (a fresh run into an old folder): the two folders are exchanged in
    // one atomic rename, so step-N is a complete checkpoint at every instant (`latest` may name it);
    // the old copy, now in step-N.tmp, goes only after that
    if (fs::exists(final_dir)) {
      if (::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0) {
        std::cerr << "ctxrun: warning: " << final_dir << " exists and this filesystem cannot exchange folders "
                  << "atomically (" << std::strerror(errno) << "); the existing checkpoint is kept, this one is not saved\n";
        fs::remove_all(tmp_dir);
        pc.world_comm->barrier();
        return final_dir;
      }
      fsync_path(dir);
      fs::remove_all(tmp_dir);
    } else {
      fs::rename(tmp_dir, final_dir);
    }
    fsync_path(dir);
    write_file_atomic((fs::path(dir) / "latest").string(), std::string(name) + "\n");
  }
  pc.world_comm->barrier();
  return final_dir;
}

namespace {

// The newest complete checkpoint in `dir` (a step-N folder holding trainer.json), or "".
std::string newest_complete(const std::string& dir) {
  std::string best;
  std::error_code ec;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step-", 0) != 0 || n.find('.') != std::string::npos || !fs::exists(e.path() / "trainer.json")) continue;
    if (best.empty() || n.size() > best.size() || (n.size() == best.size() && n > best)) best = n;
  }
  return best;
}

}  // namespace

void prepare_checkpoint_dir(Trainer& t, const std::string& dir) {
  ParallelContext& pc = t.context();
  std::string problem;
  if (pc.rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    const std::string probe = (fs::path(dir) / (".ctxrun-write-test." + std::to_string(::getpid()))).string();
    int fd = ec ? -1 : ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
      problem = "cannot write checkpoints here (" + (ec ? ec.message() : std::string(std::strerror(errno))) +
                "); give a writable folder";
    } else {
      ::close(fd);
      ::unlink(probe.c_str());
      // what a save killed before its rename left behind
      for (auto& e : fs::directory_iterator(dir, ec)) {
        const std::string n = e.path().filename().string();
        const bool stale = n.rfind("step-", 0) == 0 && (n.size() > 4 && (n.compare(n.size() - 4, 4, ".tmp") == 0 ||
                                                                         n.compare(n.size() - 4, 4, ".old") == 0));
        if (stale && e.is_directory()) {
          std::cerr << "ctxrun: removing " << e.path().string() << " (left by a save that did not finish)\n";
          fs::remove_all(e.path(), ec);
        }
      }
    }
  }
  int bad = problem.empty() ? 0 : 1;
  pc.world_comm->host_allreduce_max(&bad, 1);
  if (bad) throw InputError(dir, "--ckpt-dir", problem.empty() ? "rank 0 cannot write checkpoints here" : problem);
}

int64_t load_checkpoint(Trainer& t, const std::string& dir) {
  std::string ck = dir;
  if (!fs::exists(fs::path(dir) / "trainer.json")) {
    std::ifstream lf(fs::path(dir) / "latest");
    std::string name;
    if (!(lf >> name)) throw InputError(dir, "latest", "no checkpoint to resume from (no 'latest' file)");
    ck = (fs::path(dir) / name).string();
    if (!fs::exists(fs::path(ck) / "trainer.json")) {
      // a save killed between its folder and `latest` (or a folder removed by hand)
      const std::string newest = newest_complete(dir);
      if (newest.empty())
        throw InputError(dir, "latest", "names " + name.substr(0, 64) + ", which is not a complete checkpoint, and no other step-N folder is");
      if (t.context().rank == 0)
        std::cerr << "ctxrun: warning: " << dir << "/latest names " << name.substr(0, 64)
                  << ", which is not a complete checkpoint; resuming from " << newest << ", the newest complete one\n";
      ck = (fs::path(dir) / newest).string();
    }
  }
  const std::string index = ck + "/trainer.json";
  if (!fs::exists(index)) throw InputError(ck, "trainer.json", "missing");
  const json info = read_json_file(index);  // exit 2 naming file, line and column when damaged
  const JsonReader ri(info, index);
  const std::string schema = ri.string_or("schema", "");
  if (schema == "ctxrun.checkpoint/1") return load_consolidated(t, ck, info);
  if (schema != kSchema) throw InputError(index, "schema", "expected \"" + std::string(kSchema) + "\", got \"" + schema + "\"");
  const int64_t step = checkpoint_step(info, index);
  ParallelContext& pc = t.context();
  ParamStore& ps = t.params();
  const ModelSpec& model = t.options().model;
  const std::string advice =
      "; resharding a checkpoint to another plan is not supported: run the saving plan with --resume --steps " +
      std::to_string(step) +
      " --export-hf DIR, then start this plan with --init-from DIR (the weights carry over, the Adam state does not)";
  // the same checks on every rank, from the same file: they all fail together
  {
    const json saved = ri.has("model") ? ri.object("model").self() : json::object();
    const json a = architecture(saved), b = architecture(model_to_json(model));
    if (a != b) {
      std::string diff;
      for (auto& [k, v] : b.items())
        if (!a.contains(k) || a[k] != v)
          diff += (diff.empty() ? "" : ", ") + k + " " + (a.contains(k) ? json_excerpt(a[k]) : "missing") + " vs " + v.dump();
      const std::string saved_name = saved.contains("name") ? json_excerpt(saved["name"]) : "?";
      throw InputError(index, "model", "the checkpoint is of model " + saved_name + ", not " + model.name + " (" + diff + ")");
    }
    const json s = ri.has("sharding") ? ri.object("sharding").self() : json::object(), mine = sharding_of(pc);
    if (s != mine)
      throw InputError(index, "sharding",
                       "the checkpoint was written under " + sharding_text(s) + " (plan " + ri.string_or("plan", "?") +
                           "), this run is " + sharding_text(mine) + " (plan " + plan_to_string(pc.plan) + ")" + advice);
  }
  // this rank's own file; a problem on any rank stops every rank (each names its own file)
  const std::string file = (fs::path(ck) / rank_file(pc.rank)).string();
  std::string problem;
  std::exception_ptr failure;
  TensorMap tensors;
  try {
    std::map<std::string, std::string> md;
    std::map<std::string, std::vector<int64_t>> shapes;
    tensors = read_safetensors(file, &shapes, &md);
    const json meta = parse_json_text(md.count("ctxrun") ? md["ctxrun"] : "{}", file + " (__metadata__.ctxrun)");
    check_shard(t, file, meta, step);
    for (size_t u = 0; u < ps.units.size(); ++u)
      for (int k = 0; k < 3; ++k) {
        auto it = tensors.find(unit_tensor(u, k));
        if (it == tensors.end()) throw InputError(file, unit_tensor(u, k), "missing");
        if (static_cast<int64_t>(it->second.size()) != ps.units[u].shard)
          throw InputError(file, unit_tensor(u, k),
                           "has " + std::to_string(it->second.size()) + " floats, the shard is " +
                               std::to_string(ps.units[u].shard));
      }
  } catch (const InputError& e) {
    problem = e.what();
    failure = std::current_exception();
  }
  int bad = problem.empty() ? 0 : 1;
  pc.world_comm->host_allreduce_max(&bad, 1);
  if (bad) {
    if (!problem.empty() && pc.rank != 0) std::cerr << "ctxrun: error: rank " << pc.rank << ": " << problem << "\n";
    if (failure) std::rethrow_exception(failure);
    throw InputError(ck, "", "another rank could not load its shard file (its message is above)");
  }
  for (size_t u = 0; u < ps.units.size(); ++u)
    for (int k = 0; k < 3; ++k) ps.upload_shard(static_cast<int64_t>(u), kKinds[k], tensors[unit_tensor(u, k)]);
  ps.refresh_weights();
  t.set_steps_done(step);
  return step;
}

void export_hf(Trainer& t, const std::string& dir) {
  TensorMap w = t.params().gather_full("master");
  if (t.context().rank == 0) {
    fs::create_directories(dir);
    write_safetensors((fs::path(dir) / "model.safetensors").string(), t.params().full_shapes(), w);
    write_file_atomic((fs::path(dir) / "config.json").string(), model_to_hf_config(t.options().model).dump(2));
  }
  t.context().world_comm->barrier();
}

void load_hf_weights(Trainer& t, const std::string& dir) {
  if (fs::exists(fs::path(dir) / "trainer.json") && !fs::exists(fs::path(dir) / "model.safetensors"))
    throw InputError(dir, "", "is a sharded ctxrun checkpoint, not a Hugging Face folder: continue it with --resume "
                              "--ckpt-dir, or write a Hugging Face folder from it with --export-hf DIR");
  TensorMap all;
  std::map<std::string, std::vector<int64_t>> shapes;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") {
      TensorMap part = read_safetensors(e.path().string(), &shapes);
      for (auto& [n, v] : part) all[n] = std::move(v);
    }
  if (all.empty()) throw InputError(dir, "", "no *.safetensors files in the Hugging Face checkpoint folder");
  t.params().load_full("master", all, dir);
}

}  // namespace ctx::exec
