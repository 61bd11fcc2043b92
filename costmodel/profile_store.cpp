#include "costmodel/profile_store.hpp"
#include "costmodel/runtime_variants.hpp"

#include <cmath>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>

#include "costmodel/attention_kernels.hpp"
#include "costmodel/limits.hpp"
#include "costmodel/runtime_capabilities.hpp"
#include "costmodel/suggest.hpp"

#ifndef CTXPLAN_PROFILES_DIR
#define CTXPLAN_PROFILES_DIR "profiles"
#endif

namespace fs = std::filesystem;

namespace ctx {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kGiB = 1024.0 * kMiB;

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void require_schema(const JsonReader& r, const std::string& expected) {
  std::string s = r.string_or("schema", "");
  if (s != expected) r.fail("schema", "expected \"" + expected + "\", got \"" + s + "\"");
}

std::vector<std::string> string_list(const JsonReader& r, const std::string& key) {
  std::vector<std::string> out;
  if (!r.has(key)) return out;
  const json& v = r.raw(key);
  if (!v.is_array()) r.fail(key, "expected an array of strings");
  for (auto& e : v) {
    if (!e.is_string()) r.fail(key, "expected an array of strings");
    out.push_back(e.get<std::string>());
  }
  return out;
}

std::vector<fs::path> json_files(const fs::path& dir) {
  std::vector<fs::path> files;
  if (!fs::is_directory(dir)) return files;
  for (auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

[[noreturn]] void unknown_name(const std::string& what, const std::string& arg, const std::vector<std::string>& names,
                               const std::string& extra) {
  std::string msg = "unknown " + what + " '" + arg + "'";
  auto close = closest_names(arg, names, 3);
  if (!close.empty()) {
    msg += "; did you mean ";
    for (size_t i = 0; i < close.size(); ++i) msg += (i ? ", '" : "'") + close[i] + "'";
    msg += "?";
  }
  msg += " (`ctxplan list " + what + (what == "hardware" ? "" : "s") + "` shows all" + extra + ")";
  throw InputError("--" + (what == "hardware" ? std::string("gpu") : what), "", msg);
}

// A GPU profile by name or alias (case-insensitive), or nullptr; `names` collects every spelling.
const HardwareSpec* find_hardware(const std::vector<HardwareSpec>& hw, const std::string& arg,
                                  std::vector<std::string>* names = nullptr) {
  const HardwareSpec* found = nullptr;
  std::string a = lower(arg);
  for (auto& h : hw) {
    if (lower(h.name) == a) found = &h;
    for (auto& al : h.aliases)
      if (lower(al) == a) found = &h;
    if (names) {
      names->push_back(h.name);
      names->insert(names->end(), h.aliases.begin(), h.aliases.end());
    }
  }
  return found;
}

bool looks_like_path(const std::string& arg) {
  return arg.find('/') != std::string::npos || (arg.size() > 5 && arg.substr(arg.size() - 5) == ".json");
}

}  // namespace

std::string default_profiles_dir() {
  if (const char* env = std::getenv("CTXPLAN_PROFILES"); env && *env) return env;
  return CTXPLAN_PROFILES_DIR;
}

ModelSpec model_from_json(const json& j, const std::string& where, std::vector<std::string>* aliases) {
  JsonReader r(j, where);
  require_schema(r, "ctxplan.model/1");
  ModelSpec m;
  m.name = r.string("name");
  m.source = r.string_or("source", "");
  m.layers = r.integer_in("layers", 1, 10000);
  m.hidden = r.integer_in("hidden", 1, 1 << 20);
  m.heads = r.integer_in("heads", 1, 1 << 14);
  m.kv_heads = r.integer_in("kv_heads", 1, 1 << 14);
  m.head_dim = r.has("head_dim") ? r.integer_in("head_dim", 1, 1 << 12) : m.hidden / m.heads;
  m.ffn = r.integer_in("ffn", 1, 1 << 22);
  m.vocab = r.integer_in("vocab", 1, 1 << 24);
  m.tied_embeddings = r.boolean_or("tied_embeddings", false);
  m.qkv_bias = r.boolean_or("qkv_bias", false);
  m.qk_norm = r.boolean_or("qk_norm", false);
  m.max_position = r.integer_or("max_position", 0);
  std::string norm = r.string_or("norm", "rmsnorm");
  if (norm == "rmsnorm") m.norm = NormKind::rmsnorm;
  else if (norm == "layernorm") m.norm = NormKind::layernorm;
  else r.fail("norm", "unknown norm '" + norm + "'; valid: rmsnorm, layernorm");
  std::string act = r.string_or("activation", "swiglu");
  if (act == "swiglu") m.activation = ActivationKind::swiglu;
  else if (act == "gelu") m.activation = ActivationKind::gelu;
  else r.fail("activation", "unknown activation '" + act + "'; valid: swiglu, gelu");

  // positional: {"default": "rope"|"nope"|"alibi", "nope_layers": [...], "nope_interval": N}
  PositionKind def = PositionKind::rope;
  std::vector<int64_t> nope_layers;
  int64_t nope_interval = 0;
  if (r.has("positional")) {
    JsonReader p = r.object("positional");
    std::string d = p.string_or("default", "rope");
    if (d == "rope") def = PositionKind::rope;
    else if (d == "nope") def = PositionKind::nope;
    else if (d == "alibi") def = PositionKind::alibi;
    else p.fail("default", "unknown positional scheme '" + d + "'; valid: rope, nope, alibi");
    if (p.has("nope_layers")) {
      const json& v = p.raw("nope_layers");
      if (!v.is_array()) p.fail("nope_layers", "expected an array of layer indices");
      for (auto& e : v) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= m.layers)
          p.fail("nope_layers", "entries must be layer indices 0.." + std::to_string(m.layers - 1));
        nope_layers.push_back(e.get<int64_t>());
      }
    }
    nope_interval = p.integer_or("nope_interval", 0);
  }
  m.layer_position.assign(static_cast<size_t>(m.layers), def);
  for (auto i : nope_layers) m.layer_position[static_cast<size_t>(i)] = PositionKind::nope;
  if (nope_interval > 0)
    for (int64_t i = 0; i < m.layers; ++i)
      if ((i + 1) % nope_interval == 0) m.layer_position[static_cast<size_t>(i)] = PositionKind::nope;

  if (r.has("rope")) {
    JsonReader rope = r.object("rope");
    m.rope.base = rope.number("base");
    m.rope.partial_rotary_factor = rope.number_or("partial_rotary_factor", 1.0);
    if (rope.has("scaling")) {
      JsonReader s = rope.object("scaling");
      std::string t = s.string("type");
      if (t == "none") m.rope.scaling = RopeScaling::none;
      else if (t == "linear") m.rope.scaling = RopeScaling::linear;
      else if (t == "ntk") m.rope.scaling = RopeScaling::ntk;
      else if (t == "yarn") m.rope.scaling = RopeScaling::yarn;
      else if (t == "llama3") m.rope.scaling = RopeScaling::llama3;
      else s.fail("type", "unknown RoPE scaling '" + t + "'; valid: none, linear, ntk, yarn, llama3");
      m.rope.factor = s.number_or("factor", 1.0);
      m.rope.original_max_positions = s.integer_or("original_max_positions", 0);
      m.rope.low_freq_factor = s.number_or("low_freq_factor", 1.0);
      m.rope.high_freq_factor = s.number_or("high_freq_factor", 4.0);
      m.rope.beta_fast = s.number_or("beta_fast", 32.0);
      m.rope.beta_slow = s.number_or("beta_slow", 1.0);
    }
  }
  if (aliases) *aliases = string_list(r, "aliases");
  validate_model(m, where);
  return m;
}

json model_to_json(const ModelSpec& m) {
  json j;
  j["schema"] = "ctxplan.model/1";
  j["name"] = m.name;
  j["source"] = m.source;
  j["layers"] = m.layers;
  j["hidden"] = m.hidden;
  j["heads"] = m.heads;
  j["kv_heads"] = m.kv_heads;
  j["head_dim"] = m.head_dim;
  j["ffn"] = m.ffn;
  j["vocab"] = m.vocab;
  j["tied_embeddings"] = m.tied_embeddings;
  j["qkv_bias"] = m.qkv_bias;
  j["qk_norm"] = m.qk_norm;
  j["norm"] = to_string(m.norm);
  j["activation"] = to_string(m.activation);
  j["max_position"] = m.max_position;
  PositionKind def = m.layer_position.empty() ? PositionKind::rope : m.layer_position[0];
  for (auto k : m.layer_position)
    if (k != PositionKind::nope) def = k;
  json nope = json::array();
  for (size_t i = 0; i < m.layer_position.size(); ++i)
    if (m.layer_position[i] == PositionKind::nope && def != PositionKind::nope) nope.push_back(i);
  j["positional"] = {{"default", to_string(def)}, {"nope_layers", nope}};
  j["rope"] = {{"base", m.rope.base},
               {"partial_rotary_factor", m.rope.partial_rotary_factor},
               {"scaling",
                {{"type", to_string(m.rope.scaling)},
                 {"factor", m.rope.factor},
                 {"original_max_positions", m.rope.original_max_positions},
                 {"low_freq_factor", m.rope.low_freq_factor},
                 {"high_freq_factor", m.rope.high_freq_factor},
                 {"beta_fast", m.rope.beta_fast},
                 {"beta_slow", m.rope.beta_slow}}}};
  return j;
}

// {"source": "...", "points": [[size, efficiency], ...]}: sizes ascending and positive (scaled by
// `unit` into base units), efficiencies in (0, 1.2].
static Curve curve_from_json(const JsonReader& parent, const std::string& key, double unit) {
  JsonReader r = parent.object(key);
  Curve c;
  c.source = r.string("source");
  const json& pts = r.raw("points");
  if (!pts.is_array() || pts.empty()) r.fail("points", "expected a non-empty list of [size, efficiency] pairs");
  for (size_t i = 0; i < pts.size(); ++i) {
    const json& e = pts[i];
    std::string at = "points[" + std::to_string(i) + "]";
    if (!e.is_array() || e.size() != 2 || !e[0].is_number() || !e[1].is_number())
      r.fail(at, "expected [size, efficiency] (two numbers)");
    double x = e[0].get<double>() * unit, y = e[1].get<double>();
    if (!(x > 0) || !std::isfinite(x)) r.fail(at, "size must be a positive number");
    if (!(y > 0 && y <= 1.2)) r.fail(at, "efficiency must be in (0, 1.2] (a fraction of the peak)");
    if (!c.points.empty() && x <= c.points.back().first) r.fail(at, "sizes must be strictly ascending");
    c.points.emplace_back(x, y);
  }
  c.prepare();  // each segment's log once (curve.hpp)
  return c;
}

static KernelCurves kernels_from_json(const JsonReader& r) {
  KernelCurves k;
  JsonReader j = r.object("kernels");
  k.source = j.string_or("source", "");
  k.gemm = curve_from_json(j, "gemm_gflop", 1e9);
  // FP8 GEMMs reach a different fraction of their (twice as high) peak than bf16 ones: their own curve
  if (j.has("gemm_fp8_gflop")) k.gemm_fp8 = curve_from_json(j, "gemm_fp8_gflop", 1e9);
  // fp32 GEMMs (exact fp32 compute) reach a small fraction of the bf16 peak: their own curve where measured
  if (j.has("gemm_fp32_gflop")) k.gemm_fp32 = curve_from_json(j, "gemm_fp32_gflop", 1e9);
  k.memory = curve_from_json(j, "memory_mib", kMiB);
  k.launch_seconds = j.number("launch_us") * 1e-6;
  // kernels.attention.<name> (attention_kernels.hpp): causal curves, optional no-mask curves, head-dim
  // factor and whether packed documents run through a variable-length entry
  JsonReader a = j.object("attention");
  for (auto& [key, v] : a.self().items()) {
    const std::string name = canonical_attention(key);
    if (name.empty()) a.fail(key, "unknown attention implementation; valid: fa2, fa3, cudnn, flex, sdpa, triton, ctxrun_mma, ctxrun_fp32");
    for (auto& other : k.attention)
      if (other.name == name) a.fail(key, "names the same kernel as another key (" + name + ")");
    JsonReader e = a.object(key);
    AttentionKernel ak;
    ak.name = name;
    ak.source = e.string_or("source", "");
    ak.fwd = curve_from_json(e, "fwd_tokens", 1);
    ak.bwd = curve_from_json(e, "bwd_tokens", 1);
    if (e.has("full_fwd_tokens") || e.has("full_bwd_tokens")) {
      ak.full_fwd = curve_from_json(e, "full_fwd_tokens", 1);
      ak.full_bwd = curve_from_json(e, "full_bwd_tokens", 1);
    }
    if (e.has("head_dim")) ak.head_dim = curve_from_json(e, "head_dim", 1);
    if (e.has("document_mask")) {
      JsonReader d = e.object("document_mask");
      const json& sup = d.raw("supported");
      if (!sup.is_boolean()) d.fail("supported", "expected true or false");
      ak.document_mask = sup.get<bool>();
      ak.document_mask_source = d.string("source");
    }
    k.attention.push_back(std::move(ak));
  }
  if (k.attention.empty()) a.fail("", "needs at least one attention kernel (e.g. \"fa2\")");
  return k;
}

static CollectiveCurves collectives_from_json(const JsonReader& r) {
  CollectiveCurves c;
  JsonReader j = r.object("collectives");
  c.source = j.string("source");
  JsonReader b = j.object("intra_busbw_fraction");
  double* dst[] = {&c.all_reduce, &c.all_gather, &c.reduce_scatter, &c.all_to_all, &c.p2p};
  const char* keys[] = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"};
  for (int i = 0; i < 5; ++i) {
    *dst[i] = b.number(keys[i]);
    if (!(*dst[i] > 0 && *dst[i] <= 2)) b.fail(keys[i], "must be in (0, 2] (bus bandwidth over the link rate)");
  }
  c.inter_efficiency = j.number("inter_efficiency");
  if (!(c.inter_efficiency > 0 && c.inter_efficiency <= 1)) j.fail("inter_efficiency", "must be in (0, 1]");
  c.launch_seconds = j.number("launch_us") * 1e-6;
  return c;
}

HardwareSpec hardware_from_json(const json& j, const std::string& where) {
  JsonReader r(j, where);
  require_schema(r, "ctxplan.hardware/1");
  HardwareSpec h;
  h.name = r.string("name");
  h.aliases = string_list(r, "aliases");
  h.source = r.string_or("source", "");
  h.peak_bf16_flops = r.number("peak_bf16_tflops") * 1e12;
  h.peak_fp8_flops = r.number_or("peak_fp8_tflops", 0) * 1e12;
  h.hbm_bytes = static_cast<int64_t>(r.number("hbm_mib") * kMiB);
  h.usable_bytes = static_cast<int64_t>(r.number("usable_mib") * kMiB);
  if (h.usable_bytes <= 0 || h.usable_bytes > h.hbm_bytes) r.fail("usable_mib", "must be positive and at most hbm_mib");
  h.hbm_bytes_per_second = r.number("hbm_gbps") * 1e9;
  h.pcie_bytes_per_second = r.number("pcie_gbps") * 1e9;
  // streaming multiprocessors: what Transformer Engine's userbuffers take from the GEMMs (tp_overlap.hpp); 0 = not stated
  h.sm_count = r.number_or("sm_count", 0);
  if (h.sm_count < 0 || h.sm_count != std::floor(h.sm_count)) r.fail("sm_count", "must be a whole number of SMs (>= 1), or absent");
  // NCCL's NVLS channels on this GPU's NVSwitch node (framework_memory.hpp nccl_buffers); 0 = no NVLS
  h.nccl_nvls_channels = r.has("nccl_nvls_channels") ? r.integer_in("nccl_nvls_channels", 0, 64) : 0;
  JsonReader f = r.object("default_fabric");
  h.default_gpus_per_node = f.integer_in("gpus_per_node", 1, 1024);
  h.nvlink_bytes_per_second = f.number("nvlink_gbps") * 1e9;
  h.nvlink_latency_seconds = f.number("nvlink_latency_us") * 1e-6;
  h.network_bytes_per_second = f.number("network_gbps") * 1e9;
  h.network_latency_seconds = f.number("network_latency_us") * 1e-6;
  h.default_host_bytes_per_node = static_cast<int64_t>(f.number("host_gib_per_node") * kGiB);
  if (h.peak_bf16_flops <= 0) r.fail("peak_bf16_tflops", "must be positive");
  h.kernels = kernels_from_json(r);
  h.collectives = collectives_from_json(r);
  return h;
}

ClusterSpec make_cluster(const HardwareSpec& gpu, int64_t nodes, int64_t gpus_per_node) {
  ClusterSpec c;
  c.name = std::to_string(nodes) + "x" + std::to_string(gpus_per_node) + "x" + gpu.name;
  c.source = "shorthand: " + gpu.name + " default fabric";
  c.gpu = gpu;
  c.nodes = nodes;
  c.gpus_per_node = gpus_per_node;
  c.intra_bytes_per_second = gpu.nvlink_bytes_per_second;
  c.intra_latency_seconds = gpu.nvlink_latency_seconds;
  c.inter_bytes_per_second = gpu.network_bytes_per_second;
  c.inter_latency_seconds = gpu.network_latency_seconds;
  c.host_bytes_per_node = gpu.default_host_bytes_per_node;
  return c;
}

static ClusterSpec cluster_from_json(const json& j, const std::string& where, const std::vector<HardwareSpec>& hw) {
  JsonReader r(j, where);
  require_schema(r, "ctxplan.cluster/1");
  std::string gpu_name = r.string("gpu");
  const HardwareSpec* gpu = find_hardware(hw, gpu_name);
  if (!gpu) r.fail("gpu", "unknown GPU '" + gpu_name + "'; it must name a profile in profiles/hardware");
  const int64_t nodes = r.integer_in("nodes", 1, kMaxClusterGpus), per_node = r.integer_in("gpus_per_node", 1, 1024);
  if (nodes * per_node > kMaxClusterGpus)
    r.fail("nodes", std::to_string(nodes) + " nodes x " + std::to_string(per_node) + " GPUs is more than the " +
                        std::to_string(kMaxClusterGpus) + " GPUs a cluster may have");
  ClusterSpec c = make_cluster(*gpu, nodes, per_node);
  c.name = r.string("name");
  c.source = r.string_or("source", "");
  c.intra_bytes_per_second = r.number_or("intra_gbps", c.intra_bytes_per_second / 1e9) * 1e9;
  c.intra_latency_seconds = r.number_or("intra_latency_us", c.intra_latency_seconds * 1e6) * 1e-6;
  c.inter_bytes_per_second = r.number_or("inter_gbps", c.inter_bytes_per_second / 1e9) * 1e9;
  c.inter_latency_seconds = r.number_or("inter_latency_us", c.inter_latency_seconds * 1e6) * 1e-6;
  c.host_bytes_per_node = static_cast<int64_t>(r.number_or("host_gib_per_node", c.host_bytes_per_node / kGiB) * kGiB);
  return c;
}

RuntimeProfile runtime_from_json(const json& j, const std::string& where) {
  JsonReader r(j, where);
  require_schema(r, "ctxplan.runtime/1");
  RuntimeProfile rt;
  rt.name = r.string("name");
  rt.description = r.string_or("description", "");
  if (r.has("capabilities")) rt.capabilities = capabilities_from_json(r.object("capabilities"));
  JsonReader c = r.object("constants");
  std::string caching_allocator = "none";
  struct Field { const char* key; double* num; bool* flag; std::string* str = nullptr; bool optional = false; };
  Field fields[] = {
      {"weight_bytes", &rt.weight_bytes, nullptr},
      {"grad_bytes", &rt.grad_bytes, nullptr},
      {"grad_comm_bytes", &rt.grad_comm_bytes, nullptr, nullptr, true},  // absent: grad_bytes (below)
      {"master_bytes", &rt.master_bytes, nullptr},
      {"optimizer_bytes", &rt.optimizer_bytes, nullptr},
      {"grads_persistent", nullptr, &rt.grads_persistent},
      {"offload_grads_with_optimizer", nullptr, &rt.offload_grads_with_optimizer},
      {"activation_bytes", &rt.activation_bytes, nullptr},
      {"saves_norm_outputs", nullptr, &rt.saves_norm_outputs},
      {"mlp_saved_ffn_tensors", &rt.mlp_saved_ffn_tensors, nullptr},
      {"tiled_loss_mlp_saved_ffn_tensors", &rt.tiled_loss_mlp_saved_ffn_tensors, nullptr, nullptr, true},
      {"tiled_loss_mlp_backward_ffn_tensors", &rt.tiled_loss_mlp_backward_ffn_tensors, nullptr, nullptr, true},
      {"tiled_loss_max_tensor_elements", &rt.tiled_loss_max_tensor_elements, nullptr, nullptr, true},
      {"ulysses_saves_both_layouts", nullptr, &rt.ulysses_saves_both_layouts},
      {"ulysses_backward_resends_inputs", nullptr, &rt.ulysses_backward_resends_inputs},
      {"logits_bytes", &rt.logits_bytes, nullptr},
      {"loss_fp32_copies", &rt.loss_fp32_copies, nullptr},
      {"tiled_loss_fp32_copies", &rt.tiled_loss_fp32_copies, nullptr},
      {"zero3_prefetch_layers", &rt.zero3_prefetch_layers, nullptr},
      {"ckpt_offload_device_layers", &rt.ckpt_offload_device_layers, nullptr},
      {"ckpt_offload_prefetch_layers", &rt.ckpt_offload_prefetch_layers, nullptr},
      {"recompute_keeps_checkpoint", nullptr, &rt.recompute_keeps_checkpoint},
      {"recompute_keeps_output", nullptr, &rt.recompute_keeps_output, nullptr, true},
      {"sdpa_repeat_kv", nullptr, &rt.sdpa_repeat_kv, nullptr, true},
      {"backward_grad_tensors", &rt.backward_grad_tensors, nullptr},
      {"attention_backward_extra_q_tensors", &rt.attention_backward_extra_q_tensors, nullptr},
      {"attention_backward_extra_gqa_only", nullptr, &rt.attention_backward_extra_gqa_only, nullptr, true},
      {"attention_merges_in_place", nullptr, &rt.attention_merges_in_place},
      {"varlen_lse_padded", nullptr, &rt.varlen_lse_padded, nullptr, true},  // absent: runtime_profile.hpp's default
      {"unit_grads_fp32", nullptr, &rt.unit_grads_fp32},
      {"ring_dkv_fp32_buffers", &rt.ring_dkv_fp32_buffers, nullptr},
      {"allgather_dkv_full_sequence", nullptr, &rt.allgather_dkv_full_sequence},
      {"allgather_dkv_fp32", nullptr, &rt.allgather_dkv_fp32},
      {"cp_kv_query_heads", nullptr, &rt.cp_kv_query_heads, nullptr, true},  // absent: false
      {"cp_eager_merge_fp32", nullptr, &rt.cp_eager_merge_fp32, nullptr, true},  // absent: false
      {"cp_allgather_step_loop", nullptr, &rt.cp_allgather_step_loop, nullptr, true},  // absent: false
      {"selective_recomputes_every_second_matmul", nullptr, &rt.selective_recomputes_every_second_matmul, nullptr, true},  // absent: false
      {"step_overhead_optimizer_offload_only", nullptr, &rt.step_overhead_optimizer_offload_only, nullptr, true},  // absent: false
      {"reduce_bucket_mib", &rt.reduce_bucket_bytes, nullptr},
      {"reserved_mib", &rt.reserved_bytes, nullptr},
      {"fragmentation", &rt.fragmentation, nullptr},
      {"host_gib_per_rank", &rt.host_bytes_per_rank, nullptr},
      {"token_data_bytes", &rt.token_data_bytes, nullptr},
      {"query_identity_bytes", &rt.query_identity_bytes, nullptr},
      {"key_block_bytes", &rt.key_block_bytes, nullptr},
      {"attention_kernel", nullptr, nullptr, &rt.attention_kernel},
      {"cpu_adam_gparams_per_s", &rt.cpu_adam_params_per_second, nullptr},
      {"host_fp32_to_bf16_gelems_per_s", &rt.host_fp32_to_bf16_elems_per_second, nullptr, nullptr, true},  // absent: 0
      {"optimizer_offload_on_device", nullptr, &rt.optimizer_offload_on_device},
      {"memory_traffic_factor", &rt.memory_traffic_factor, nullptr},
      // framework memory terms (framework_memory.hpp), optional: absent = the term is not there
      {"zero3_grad_partition_bytes", &rt.zero3_grad_partition_bytes, nullptr, nullptr, true},
      {"zero3_param_offload_pinned_pow2", nullptr, &rt.zero3_param_offload_pinned_pow2, nullptr, true},
      {"dataloader_forks_after_offload_buffers", nullptr, &rt.dataloader_forks_after_offload_buffers, nullptr, true},
      {"nccl_channels", &rt.nccl_channels, nullptr, nullptr, true},
      {"ulysses_group_collectives", nullptr, &rt.ulysses_group_collectives, nullptr, true},
      {"world_group_collectives", nullptr, &rt.world_group_collectives, nullptr, true},
      {"caching_allocator", nullptr, nullptr, &caching_allocator, true},
      {"megatron_buffer_padding", nullptr, &rt.megatron_buffer_padding, nullptr, true},
      // Transformer Engine userbuffers configuration (tp_overlap.hpp), optional: absent = ring exchanges only
      {"tp_overlap_rs_splits", &rt.tp_overlap_rs_splits, nullptr, nullptr, true},
      {"tp_overlap_proj_fprop_sms", &rt.tp_overlap_proj_fprop_sms, nullptr, nullptr, true},
      {"tp_overlap_fc2_fprop_sms", &rt.tp_overlap_fc2_fprop_sms, nullptr, nullptr, true},
      {"tp_overlap_qkv_dgrad_sms", &rt.tp_overlap_qkv_dgrad_sms, nullptr, nullptr, true},
      {"tp_overlap_qkv_wgrad_sms", &rt.tp_overlap_qkv_wgrad_sms, nullptr, nullptr, true},
      {"tp_overlap_fc1_dgrad_sms", &rt.tp_overlap_fc1_dgrad_sms, nullptr, nullptr, true},
      {"tp_overlap_fc1_wgrad_sms", &rt.tp_overlap_fc1_wgrad_sms, nullptr, nullptr, true},
      // torch.compile (plan key compile), optional: absent = the eager constants hold under compile
      {"compiled_mlp_saved_ffn_tensors", &rt.compiled_mlp_saved_ffn_tensors, nullptr, nullptr, true},
      {"compiled_saves_norm_outputs", nullptr, &rt.compiled_saves_norm_outputs, nullptr, true},
      {"compiled_loss_logit_copies", &rt.compiled_loss_logit_copies, nullptr, nullptr, true},
      {"loss_parallel_fp32_copies", &rt.loss_parallel_fp32_copies, nullptr, nullptr, true},
      {"grad_shards_reserved_by_reduce_stream", nullptr, &rt.grad_shards_reserved_by_reduce_stream, nullptr, true},
      {"zero3_root_unit_unsharded", nullptr, &rt.zero3_root_unit_unsharded, nullptr, true},
      {"zero3_last_layer_kept_after_forward", nullptr, &rt.zero3_last_layer_kept_after_forward, nullptr, true},
  };
  for (auto& [key, v] : c.self().items()) {
    bool known = key == "attention_kernels";  // a list, read below
    for (auto& n : calibration_constant_names()) known |= key == n;  // optional, read below
    for (auto& f : fields) known |= (key == f.key);
    if (!known) {
      std::vector<std::string> names;
      for (auto& f : fields) names.push_back(f.key);
      auto close = closest_names(key, names, 1);
      c.fail(key, "unknown runtime constant" + (close.empty() ? std::string() : " (did you mean '" + close[0] + "'?)"));
    }
  }
  for (auto& f : fields) {
    if (f.optional && !c.has(f.key)) continue;
    JsonReader e = c.object(f.key);  // every constant is {"value": ..., "source": "..."}
    std::string src = e.string("source");
    if (src.empty()) e.fail("source", "every runtime constant needs a source or reason");
    rt.sources[f.key] = src;
    if (f.str) {
      *f.str = e.string("value");
    } else if (f.flag) {
      const json& v = e.raw("value");
      if (!v.is_boolean()) e.fail("value", "expected true or false");
      *f.flag = v.get<bool>();
    } else {
      double v = e.number("value");
      if (v < 0) e.fail("value", "must be >= 0");
      *f.num = v;
    }
  }
  // the default kernel and the kernels the stack can run (--attention); profiles before issue 16 name
  // only the default, which is then the one kernel they run
  std::string alternatives;
  for (size_t start = 0;;) {
    const size_t bar = rt.attention_kernel.find('|', start);
    const std::string name = canonical_attention(rt.attention_kernel.substr(start, bar == std::string::npos ? bar : bar - start));
    if (name.empty())
      c.object("attention_kernel").fail("value", "'" + rt.attention_kernel + "' names an unknown attention implementation; valid: " +
                                                     attention_choices() + ", ctxrun_mma, ctxrun_fp32 (alternatives as \"a|b\")");
    if (start == 0) rt.attention_kernels.push_back(name);
    alternatives += (start == 0 ? "" : "|") + name;
    if (bar == std::string::npos) break;
    start = bar + 1;
  }
  rt.attention_kernel = alternatives;
  if (c.has("attention_kernels")) {
    JsonReader e = c.object("attention_kernels");
    std::string src = e.string("source");
    if (src.empty()) e.fail("source", "every runtime constant needs a source or reason");
    rt.sources["attention_kernels"] = src;
    const json& list = e.raw("value");
    if (!list.is_array() || list.empty()) e.fail("value", "expected a non-empty list of kernel names, e.g. [\"fa2\", \"sdpa\"]");
    rt.attention_kernels.clear();
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string at = "value[" + std::to_string(i) + "]";
      if (!list[i].is_string()) e.fail(at, "expected a kernel name");
      const std::string name = canonical_attention(list[i].get<std::string>());
      if (name.empty())
        e.fail(at, "'" + list[i].get<std::string>() + "' is no attention implementation; valid: " + attention_choices() +
                       ", ctxrun_mma, ctxrun_fp32");
      rt.attention_kernels.push_back(name);
    }
    const std::string def = rt.attention_kernel.substr(0, rt.attention_kernel.find('|'));
    bool listed = false;
    for (auto& n : rt.attention_kernels) listed |= (n == def);
    if (!listed) e.fail("value", "must list the default kernel '" + def + "' (constants.attention_kernel)");
  }
  if (c.has("compiled_mlp_saved_ffn_tensors") != c.has("compiled_saves_norm_outputs"))
    c.fail(c.has("compiled_mlp_saved_ffn_tensors") ? "compiled_saves_norm_outputs" : "compiled_mlp_saved_ffn_tensors",
           "compiled_mlp_saved_ffn_tensors and compiled_saves_norm_outputs state a compiled block together: give both or neither");
  if (c.has("tiled_loss_mlp_saved_ffn_tensors") != c.has("tiled_loss_mlp_backward_ffn_tensors"))
    c.fail(c.has("tiled_loss_mlp_saved_ffn_tensors") ? "tiled_loss_mlp_backward_ffn_tensors" : "tiled_loss_mlp_saved_ffn_tensors",
           "tiled_loss_mlp_saved_ffn_tensors and tiled_loss_mlp_backward_ffn_tensors state the fused MLP together: give both or neither");
  if (caching_allocator == "none") rt.caching_allocator = RuntimeProfile::CachingAllocator::none;
  else if (caching_allocator == "segments") rt.caching_allocator = RuntimeProfile::CachingAllocator::segments;
  else if (caching_allocator == "expandable_segments") rt.caching_allocator = RuntimeProfile::CachingAllocator::expandable_segments;
  else c.object("caching_allocator").fail("value", "'" + caching_allocator + "' is no caching allocator mode; valid: none, segments, expandable_segments");
  // the gradient reduction's dtype on the wire: profiles before it existed reduced their grad_bytes
  if (!c.has("grad_comm_bytes")) {
    rt.grad_comm_bytes = rt.grad_bytes;
    rt.sources["grad_comm_bytes"] = "absent: the gradient buffer's dtype (grad_bytes)";
  } else if (rt.grad_comm_bytes != 1 && rt.grad_comm_bytes != 2 && rt.grad_comm_bytes != 4) {
    c.object("grad_comm_bytes").fail("value", "must be 4 (fp32), 2 (bf16 or fp16) or 1 (an 8-bit format): bytes per gradient element the reduction sends");
  }
  if (rt.nccl_channels != std::floor(rt.nccl_channels))
    c.object("nccl_channels").fail("value", "must be a whole number of channels");
  rt.reduce_bucket_bytes *= kMiB;
  rt.reserved_bytes *= kMiB;
  rt.host_bytes_per_rank *= kGiB;
  rt.cpu_adam_params_per_second *= 1e9;
  rt.host_fp32_to_bf16_elems_per_second *= 1e9;
  // a calibrated profile's scales (ctxplan calibrate), each {"value", "source"}; absent: 1 and 0
  double* scales[] = {&rt.gemm_efficiency_scale, &rt.attention_efficiency_scale, &rt.comm_efficiency_scale, &rt.step_overhead_seconds};
  for (size_t i = 0; i < calibration_constant_names().size(); ++i) {
    const std::string& key = calibration_constant_names()[i];
    if (!c.has(key)) continue;
    JsonReader e = c.object(key);
    rt.sources[key] = e.string("source");
    const double v = e.number("value");
    if (!std::isfinite(v) || (i < 3 ? v <= 0 : v < 0))
      e.fail("value", i < 3 ? "must be a positive scale (1 = the hardware profile's curve)" : "must be >= 0 seconds");
    *scales[i] = v;
  }
  // measured vs predicted step times (ctxplan calibrate writes them; error_band.hpp reads them)
  if (r.has("calibration") && r.object("calibration").has("residuals")) {
    JsonReader cal = r.object("calibration");
    const json& list = cal.raw("residuals");
    if (!list.is_array()) cal.fail("residuals", "expected a list of {\"id\", \"gpu\", \"log_ratio\"}");
    // each run's measured step (calibration.runs, by id): with the leave-one-out log ratio, the step
    // predicted out of sample (ctxplan validate's leave-one-out column)
    std::map<std::string, double> measured;
    if (cal.has("runs") && cal.raw("runs").is_array())
      for (const json& run : cal.raw("runs"))
        if (run.is_object() && run.contains("id") && run["id"].is_string() && run.contains("measured_step_seconds") &&
            run["measured_step_seconds"].is_number())
          measured[run["id"].get<std::string>()] = run["measured_step_seconds"].get<double>();
    for (size_t i = 0; i < list.size(); ++i) {
      JsonReader e(list[i], where + ": calibration.residuals[" + std::to_string(i) + "]");
      TimeResidual t{e.string("id"), e.string("gpu"), e.number("log_ratio")};
      if (auto it = measured.find(t.id); it != measured.end()) t.measured_step_seconds = it->second;
      rt.time_residuals.push_back(t);
    }
  }
  // a calibrated profile may find memory-bound kernels faster than the hardware curve says (< 1)
  if (rt.memory_traffic_factor <= 0 || (rt.memory_traffic_factor < 1 && !r.has("calibration")))
    c.object("memory_traffic_factor").fail("value", "must be >= 1 (1 = fused kernels; below 1 only in a calibrated profile)");
  if (rt.cpu_adam_params_per_second <= 0) c.object("cpu_adam_gparams_per_s").fail("value", "must be positive");
  if (rt.host_fp32_to_bf16_elems_per_second < 0)
    c.object("host_fp32_to_bf16_gelems_per_s").fail("value", "must be >= 0 (elements per second, in 1e9; 0 or absent: not priced)");
  // optimizer precision: the runtime runs its own values (its constants) whatever its capabilities list
  if (rt.capabilities.declared) {
    const StateDtypes own = runtime_state_dtypes(rt);
    const std::pair<std::vector<StateDtype>*, std::pair<StateDtype, const char*>> keys[] = {
        {&rt.capabilities.master, {own.master, "master"}},
        {&rt.capabilities.grads, {own.grads, "grads"}},
        {&rt.capabilities.moments, {own.moments, "moments"}}};
    for (auto& [allowed, own_key] : keys) {
      if (std::find(allowed->begin(), allowed->end(), own_key.first) != allowed->end()) continue;
      allowed->insert(allowed->begin(), own_key.first);
      auto& src = rt.capabilities.sources[own_key.second];
      if (src.empty()) src = "the runtime's own (its constants' model-state bytes); no other value stated";
    }
  }
  return rt;
}

namespace {

// A runtime profile's "variants" (a framework version that changes some constants, e.g. a newer Liger):
// {"variants": {"<variant>": {"description": "...", "source": "...", "constants": {<key>: {"value", "source"}}}}}.
// The variant is the base document with those constants replaced, named "<runtime>@<variant>";
// everything else (capabilities, calibration, residuals) is the base's.
json runtime_variant_json(const json& base, const std::string& variant, const std::string& where) {
  JsonReader r(base, where);
  const std::string base_name = r.string("name");
  if (!r.has("variants")) r.fail("variants", "runtime '" + base_name + "' has no variants; '" + base_name + "@" + variant + "' names none");
  JsonReader vs = r.object("variants");  // an object, or it fails naming the field
  const json& all = base.at("variants");
  if (!all.contains(variant)) {
    std::string names;
    for (auto it = all.begin(); it != all.end(); ++it) names += (names.empty() ? "" : ", ") + base_name + "@" + it.key();
    r.fail("variants", "runtime '" + base_name + "' has no variant '" + variant + "'; valid: " + names);
  }
  JsonReader v = vs.object(variant);
  if (v.string("source").empty()) v.fail("source", "a variant needs the source of the version fact it states");
  const std::string description = v.string("description");
  v.object("constants");
  const json& overrides = all.at(variant).at("constants");
  if (overrides.empty()) v.fail("constants", "expected the constants the variant changes, each {\"value\", \"source\"}");
  json out = base;
  out.erase("variants");
  out["name"] = base_name + "@" + variant;
  out["description"] = description;
  for (auto it = overrides.begin(); it != overrides.end(); ++it) out["constants"][it.key()] = it.value();
  return out;
}

}  // namespace

Profiles load_profiles(const std::string& dir) {
  Profiles p;
  p.dir = dir;
  if (!fs::is_directory(dir))
    throw InputError(dir, "", "profiles folder not found (set CTXPLAN_PROFILES or pass --profiles)");
  for (auto& f : json_files(fs::path(dir) / "hardware")) p.hardware.push_back(hardware_from_json(read_json_file(f), f));
  for (auto& f : json_files(fs::path(dir) / "models")) {
    std::vector<std::string> aliases;
    p.models.push_back(model_from_json(read_json_file(f), f, &aliases));
    p.model_aliases.push_back(aliases);
  }
  for (auto& f : json_files(fs::path(dir) / "clusters"))
    p.clusters.push_back(cluster_from_json(read_json_file(f), f, p.hardware));
  for (auto& f : json_files(fs::path(dir) / "runtimes")) {
    const json j = read_json_file(f);
    p.runtimes.push_back(runtime_from_json(j, f));
    // every variant must parse now, so a bad one is reported at start-up naming its file and key
    if (j.contains("variants") && j["variants"].is_object())
      for (auto it = j["variants"].begin(); it != j["variants"].end(); ++it)
        runtime_from_json(runtime_variant_json(j, it.key(), f.string()), f.string() + " variants." + it.key());
  }
  return p;
}

ModelSpec resolve_model(const Profiles& p, const std::string& arg) {
  std::string a = lower(arg);
  for (size_t i = 0; i < p.models.size(); ++i) {
    if (lower(p.models[i].name) == a) return p.models[i];
    for (auto& al : p.model_aliases[i])
      if (lower(al) == a) return p.models[i];
  }
  if (looks_like_path(arg) || fs::exists(arg)) {
    std::string path = arg;
    if (fs::is_directory(path)) path = (fs::path(path) / "config.json").string();
    json j = read_json_file(path);
    if (j.is_object() && j.contains("schema")) return model_from_json(j, path);
    return model_from_hf_config(j, path);
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < p.models.size(); ++i) {
    names.push_back(p.models[i].name);
    for (auto& al : p.model_aliases[i]) names.push_back(al);
  }
  unknown_name("model", arg, names, ", or pass a path to a Hugging Face config.json");
}

const HardwareSpec& resolve_hardware(const Profiles& p, const std::string& arg) {
  std::vector<std::string> names;
  if (const HardwareSpec* h = find_hardware(p.hardware, arg, &names)) return *h;
  unknown_name("hardware", arg, names, "");
}

ClusterSpec resolve_cluster(const Profiles& p, const std::string& arg) {
  std::string a = lower(arg);
  for (auto& c : p.clusters)
    if (lower(c.name) == a) return c;
  static const std::regex shorthand(R"(^(?:(\d+)x)?(\d+)x([A-Za-z][A-Za-z0-9_.-]*)$)");
  std::smatch m;
  if (std::regex_match(arg, m, shorthand)) {
    // digits only (the pattern guarantees it); compare as text length first so huge counts cannot overflow
    auto count = [](const std::string& digits) { return digits.size() > 9 ? int64_t(-1) : std::stoll(digits); };
    int64_t nodes = m[1].matched ? count(m[1].str()) : 1;
    int64_t per_node = count(m[2].str());
    if (nodes < 1 || per_node < 1 || per_node > 1024 || nodes > kMaxClusterGpus || nodes * per_node > kMaxClusterGpus)
      throw InputError("--cluster", "", "'" + arg + "': GPUs per node must be 1..1024 and nodes x GPUs per node 1.." +
                                            std::to_string(kMaxClusterGpus));
    std::vector<std::string> names;
    const HardwareSpec* gpu = find_hardware(p.hardware, m[3].str(), &names);
    if (!gpu) {
      auto close = closest_names(m[3].str(), names, 3);
      std::string msg = "unknown GPU '" + m[3].str() + "' in cluster shorthand '" + arg + "'";
      if (!close.empty()) msg += "; did you mean '" + close[0] + "'?";
      throw InputError("--cluster", "", msg + " (`ctxplan list hardware` shows all)");
    }
    return make_cluster(*gpu, nodes, per_node);
  }
  if (looks_like_path(arg)) return cluster_from_json(read_json_file(arg), arg, p.hardware);
  std::vector<std::string> names;
  for (auto& c : p.clusters) names.push_back(c.name);
  unknown_name("cluster", arg, names, "; or write <nodes>x<gpus per node>x<gpu>, e.g. 8xh100 or 16x8xh200");
}

std::vector<RuntimeVariantInfo> runtime_variants(const Profiles& p, const std::string& runtime) {
  std::vector<RuntimeVariantInfo> out;
  for (auto& f : json_files(fs::path(p.dir) / "runtimes")) {
    const json j = read_json_file(f);
    if (!j.contains("name") || !j["name"].is_string() || !j.contains("variants") || !j["variants"].is_object()) continue;
    const std::string name = j["name"].get<std::string>();
    if (!runtime.empty() && lower(name) != lower(runtime)) continue;
    for (auto it = j["variants"].begin(); it != j["variants"].end(); ++it)
      out.push_back({name + "@" + it.key(), it.value().is_object() ? it.value().value("description", "") : ""});
  }
  return out;
}

RuntimeProfile resolve_runtime(const Profiles& p, const std::string& arg) {
  // <runtime>@<variant>: the built-in runtime's file, or a runtime JSON path, with the variant's constants
  // (a path whose folders or name hold an '@' is a path: the variant is the text after the last '@' only when
  // that text is no path and the whole argument names no file)
  if (const size_t at = arg.rfind('@'); at != std::string::npos && at > 0 && at + 1 < arg.size() &&
                                         arg.find('/', at) == std::string::npos && !fs::exists(arg)) {
    const std::string base = arg.substr(0, at), variant = arg.substr(at + 1);
    if (looks_like_path(base)) return runtime_from_json(runtime_variant_json(read_json_file(base), variant, base), base + "@" + variant);
    for (auto& f : json_files(fs::path(p.dir) / "runtimes")) {
      const json j = read_json_file(f);
      if (j.contains("name") && j["name"].is_string() && lower(j["name"].get<std::string>()) == lower(base))
        return runtime_from_json(runtime_variant_json(j, variant, f.string()), f.string() + "@" + variant);
    }
  }
  std::vector<std::string> names;
  for (auto& r : p.runtimes) {
    if (lower(r.name) == lower(arg)) return r;
    names.push_back(r.name);
  }
  if (looks_like_path(arg)) return runtime_from_json(read_json_file(arg), arg);
  unknown_name("runtime", arg, names, ", or pass the path of a runtime JSON (ctxplan calibrate -o writes one)");
}

const std::vector<std::string>& calibration_constant_names() {
  static const std::vector<std::string> names = {"gemm_efficiency_scale", "attention_efficiency_scale", "comm_efficiency_scale",
                                                 "step_overhead_seconds"};
  return names;
}

}  // namespace ctx
