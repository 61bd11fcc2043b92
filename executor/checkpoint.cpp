#include "executor/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <filesystem>
#include <fstream>

#include "costmodel/errors.hpp"
#include "costmodel/profile_store.hpp"

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

float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
float f16_to_float(uint16_t h) {
  uint32_t s = (h >> 15) & 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  float v = e == 0 ? std::ldexp(static_cast<float>(m), -24)
            : e == 31 ? (m ? NAN : INFINITY)
                      : std::ldexp(static_cast<float>(m | 0x400), static_cast<int>(e) - 25);
  return s ? -v : v;
}

std::string safetensors_bytes(const ShapeList& order, const TensorMap& tensors,
                              const std::map<std::string, std::string>& extra_metadata = {}) {
  json header = json::object();
  uint64_t off = 0;
  for (auto& [name, shape] : order) {
    uint64_t n = tensors.at(name).size() * 4;
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  header["__metadata__"] = {{"format", "pt"}, {"producer", "ctxrun"}};
  for (auto& [k, v] : extra_metadata) header["__metadata__"][k] = v;
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::string out(8, '\0');
  uint64_t hn = h.size();
  std::memcpy(out.data(), &hn, 8);
  out += h;
  for (auto& [name, shape] : order) {
    const auto& v = tensors.at(name);
    out.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  return out;
}

}  // namespace

void write_safetensors(const std::string& path, const ShapeList& order, const TensorMap& tensors) {
  write_file_atomic(path, safetensors_bytes(order, tensors));
}

TensorMap read_safetensors(const std::string& path, std::map<std::string, std::vector<int64_t>>* shapes,
                           std::map<std::string, std::string>* metadata) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(path, "", "cannot open the safetensors file");
  uint64_t hn = 0;
  f.read(reinterpret_cast<char*>(&hn), 8);
  const auto size = fs::file_size(path);
  if (!f || hn == 0 || hn > size - 8) throw InputError(path, "header", "not a safetensors file (bad header length)");
  std::string h(hn, '\0');
  f.read(h.data(), static_cast<std::streamsize>(hn));
  json header;
  try {
    header = json::parse(h);
  } catch (const std::exception& e) {
    throw InputError(path, "header", std::string("header is not JSON: ") + e.what());
  }
  const uint64_t data0 = 8 + hn;
  TensorMap out;
  for (auto& [name, t] : header.items()) {
    if (name == "__metadata__") {
      if (metadata && t.is_object())
        for (auto& [k, v] : t.items()) (*metadata)[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    std::string dt = t.value("dtype", "");
    auto offs = t.at("data_offsets");
    uint64_t a = offs[0].get<uint64_t>(), b = offs[1].get<uint64_t>();
    if (b < a || data0 + b > size) throw InputError(path, name, "data offsets run past the end of the file (truncated?)");
    std::string raw(b - a, '\0');
    f.seekg(static_cast<std::streamoff>(data0 + a));
    f.read(raw.data(), static_cast<std::streamsize>(b - a));
    std::vector<float> v;
    if (dt == "F32") {
      v.resize(raw.size() / 4);
      std::memcpy(v.data(), raw.data(), raw.size());
    } else if (dt == "BF16" || dt == "F16") {
      v.resize(raw.size() / 2);
      for (size_t i = 0; i < v.size(); ++i) {
        uint16_t x;
        std::memcpy(&x, raw.data() + 2 * i, 2);
        v[i] = dt == "BF16" ? bf16_to_float(x) : f16_to_float(x);
      }
    } else {
      throw InputError(path, name, "dtype " + dt + " is not supported (F32, BF16, F16)");
    }
    if (shapes) shapes->emplace(name, t.at("shape").get<std::vector<int64_t>>());
    out.emplace(name, std::move(v));
  }
  return out;
}

namespace {

// Schema ctxrun.checkpoint/1 (before sharded checkpoints): full tensors in model.safetensors and
// optimizer.safetensors, readable under any plan.
int64_t load_consolidated(Trainer& t, const std::string& ck, const json& info) {
  std::map<std::string, std::vector<int64_t>> shapes;
  TensorMap w = read_safetensors(ck + "/model.safetensors", &shapes);
  for (auto& [name, shape] : t.params().full_shapes()) {
    auto it = shapes.find(name);
    std::string want;
    for (auto d : shape) want += (want.empty() ? "" : "x") + std::to_string(d);
    if (it == shapes.end())
      throw InputError(ck + "/model.safetensors", name,
                       "missing: the checkpoint is not of model " + t.options().model.name + " (needs " + want + ")");
    if (it->second != shape) {
      std::string got;
      for (auto d : it->second) got += (got.empty() ? "" : "x") + std::to_string(d);
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
  int64_t step = info.value("step", int64_t(0));
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
  return {{"world", pc.world}, {"tp", p.tp},   {"cp", p.cp},
          {"dp", p.dp},        {"zero", p.zero}, {"ulysses", ulysses_degree(p)}};
}

std::string sharding_text(const json& s) {
  std::string out;
  for (const char* k : {"tp", "cp", "dp", "zero", "ulysses"})
    out += (out.empty() ? "" : ",") + std::string(k) + "=" + (s.contains(k) ? s[k].dump() : "?");
  return out + " on " + (s.contains("world") ? s["world"].dump() : "?") + " ranks";
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
  auto differs = [&](const char* key) { return !meta.contains(key) || meta[key] != mine[key]; };
  if (meta.value("schema", "") != kShardSchema)
    throw InputError(file, "__metadata__", "not a ctxrun shard file (schema " + meta.value("schema", "missing") + ")");
  if (meta.value("step", int64_t(-1)) != step)
    throw InputError(file, "step", "holds step " + meta.value("step", json()).dump() + " but the index says " +
                                       std::to_string(step) + " (mixed checkpoints?)");
  if (differs("sharding"))
    throw InputError(file, "sharding", "written under " + sharding_text(meta.value("sharding", json::object())) +
                                           ", this run is " + sharding_text(mine["sharding"]));
  for (const char* k : {"rank", "coord", "zero_rank", "zero_size"})
    if (differs(k))
      throw InputError(file, k, "belongs to " + std::string(k) + " " + meta.value(k, json()).dump() + ", this rank has " +
                                    mine[k].dump());
  if (differs("units")) {
    const json& a = meta.value("units", json::array());
    const json& b = mine["units"];
    std::string why = "holds " + std::to_string(a.size()) + " units, the model has " + std::to_string(b.size());
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (a[i] != b[i]) {
        why = "unit " + std::to_string(i) + " is " + a[i].dump() + " in the file, " + b[i].dump() + " here";
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
    // the same step saved again (e.g. a resume that ran no step): the old copy goes only once the
    // new one is in place
    const std::string old_dir = final_dir + ".old";
    fs::remove_all(old_dir);
    if (fs::exists(final_dir)) fs::rename(final_dir, old_dir);
    fs::rename(tmp_dir, final_dir);
    fsync_path(dir);
    write_file_atomic((fs::path(dir) / "latest").string(), std::string(name) + "\n");
    fs::remove_all(old_dir);
  }
  pc.world_comm->barrier();
  return final_dir;
}

int64_t load_checkpoint(Trainer& t, const std::string& dir) {
  std::string ck = dir;
  if (!fs::exists(fs::path(dir) / "trainer.json")) {
    std::ifstream lf(fs::path(dir) / "latest");
    std::string name;
    if (!(lf >> name)) throw InputError(dir, "latest", "no checkpoint to resume from (no 'latest' file)");
    ck = (fs::path(dir) / name).string();
  }
  const std::string index = ck + "/trainer.json";
  std::ifstream jf(index);
  if (!jf) throw InputError(ck, "trainer.json", "missing");
  json info;
  try {
    info = json::parse(jf);
  } catch (const std::exception& e) {
    throw InputError(index, "", std::string("not JSON: ") + e.what());
  }
  const std::string schema = info.value("schema", "");
  if (schema == "ctxrun.checkpoint/1") return load_consolidated(t, ck, info);
  if (schema != kSchema) throw InputError(index, "schema", "expected \"" + std::string(kSchema) + "\", got \"" + schema + "\"");
  ParallelContext& pc = t.context();
  ParamStore& ps = t.params();
  const ModelSpec& model = t.options().model;
  const std::string advice =
      "; resharding a checkpoint to another plan is not supported: run the saving plan with --resume --steps " +
      info.value("step", json()).dump() +
      " --export-hf DIR, then start this plan with --init-from DIR (the weights carry over, the Adam state does not)";
  // the same checks on every rank, from the same file: they all fail together
  {
    const json saved = info.value("model", json::object());
    const json a = architecture(saved), b = architecture(model_to_json(model));
    if (a != b) {
      std::string diff;
      for (auto& [k, v] : b.items())
        if (!a.contains(k) || a[k] != v)
          diff += (diff.empty() ? "" : ", ") + k + " " + (a.contains(k) ? a[k].dump() : "missing") + " vs " + v.dump();
      throw InputError(index, "model",
                       "the checkpoint is of model " + saved.value("name", std::string("?")) + ", not " + model.name +
                           " (" + diff + ")");
    }
    const json s = info.value("sharding", json::object()), mine = sharding_of(pc);
    if (s != mine)
      throw InputError(index, "sharding",
                       "the checkpoint was written under " + sharding_text(s) + " (plan " + info.value("plan", "?") +
                           "), this run is " + sharding_text(mine) + " (plan " + plan_to_string(pc.plan) + ")" + advice);
  }
  const int64_t step = info.value("step", int64_t(0));
  // this rank's own file; a problem on any rank stops every rank (each names its own file)
  const std::string file = (fs::path(ck) / rank_file(pc.rank)).string();
  std::string problem;
  std::exception_ptr failure;
  TensorMap tensors;
  try {
    std::map<std::string, std::string> md;
    std::map<std::string, std::vector<int64_t>> shapes;
    tensors = read_safetensors(file, &shapes, &md);
    json meta;
    try {
      meta = json::parse(md.count("ctxrun") ? md["ctxrun"] : "{}");
    } catch (const std::exception& e) {
      throw InputError(file, "__metadata__", std::string("ctxrun metadata is not JSON: ") + e.what());
    }
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
