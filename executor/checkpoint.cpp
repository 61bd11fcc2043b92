#include "executor/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
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

std::string safetensors_bytes(const ShapeList& order, const TensorMap& tensors) {
  json header = json::object();
  uint64_t off = 0;
  for (auto& [name, shape] : order) {
    uint64_t n = tensors.at(name).size() * 4;
    header[name] = {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  header["__metadata__"] = {{"format", "pt"}, {"producer", "ctxrun"}};
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

TensorMap read_safetensors(const std::string& path, std::map<std::string, std::vector<int64_t>>* shapes) {
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
    if (name == "__metadata__") continue;
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

std::string save_checkpoint(Trainer& t, const std::string& dir, const json& run_info) {
  ParamStore& ps = t.params();
  TensorMap w = ps.gather_full("master"), m = ps.gather_full("m"), v = ps.gather_full("v");
  const bool root = t.context().rank == 0;
  char name[32];
  std::snprintf(name, sizeof(name), "step-%06lld", static_cast<long long>(t.steps_done()));
  const std::string final_dir = (fs::path(dir) / name).string();
  if (root) {
    const std::string tmp_dir = final_dir + ".tmp";
    fs::create_directories(dir);
    fs::remove_all(tmp_dir);
    fs::create_directories(tmp_dir);
    ShapeList shapes = ps.full_shapes();
    write_safetensors(tmp_dir + "/model.safetensors", shapes, w);
    ShapeList oshapes;
    TensorMap ot;
    for (auto& [n, s] : shapes) {
      oshapes.push_back({"exp_avg." + n, s});
      oshapes.push_back({"exp_avg_sq." + n, s});
      ot["exp_avg." + n] = std::move(m[n]);
      ot["exp_avg_sq." + n] = std::move(v[n]);
    }
    write_safetensors(tmp_dir + "/optimizer.safetensors", oshapes, ot);
    json info = run_info;
    info["schema"] = "ctxrun.checkpoint/1";
    info["step"] = t.steps_done();
    info["model"] = model_to_json(t.options().model);
    write_file_atomic(tmp_dir + "/trainer.json", info.dump(2));
    // config.json beside model.safetensors: the folder opens as a Hugging Face Llama checkpoint
    // and is a valid --init-from source
    write_file_atomic(tmp_dir + "/config.json", model_to_hf_config(t.options().model).dump(2));
    fs::remove_all(final_dir);
    fs::rename(tmp_dir, final_dir);
    fsync_path(dir);
    write_file_atomic((fs::path(dir) / "latest").string(), std::string(name) + "\n");
  }
  t.context().world_comm->barrier();
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
  std::ifstream jf(fs::path(ck) / "trainer.json");
  if (!jf) throw InputError(ck, "trainer.json", "missing");
  json info;
  try {
    info = json::parse(jf);
  } catch (const std::exception& e) {
    throw InputError(ck + "/trainer.json", "", std::string("not JSON: ") + e.what());
  }
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

void load_hf_weights(Trainer& t, const std::string& dir) {
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
