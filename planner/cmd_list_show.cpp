// `ctxplan list models|hardware|clusters|runtimes` and `ctxplan show model|hardware|cluster|runtime NAME`.
#include <iostream>

#include "costmodel/profile_store.hpp"
#include "costmodel/suggest.hpp"
#include "planner/commands.hpp"
#include "costmodel/exit_codes.hpp"
#include "costmodel/runtime_variants.hpp"
#include "planner/format.hpp"

namespace ctx {
namespace {

const std::vector<std::string> kKinds = {"models", "hardware", "clusters", "runtimes"};

std::string normalise_kind(const std::string& k, bool plural) {
  std::string s = k;
  if (s == "model" || s == "models") s = "models";
  else if (s == "gpu" || s == "gpus" || s == "hardware") s = "hardware";
  else if (s == "cluster" || s == "clusters") s = "clusters";
  else if (s == "runtime" || s == "runtimes") s = "runtimes";
  else {
    auto close = closest_names(k, kKinds, 1);
    throw InputError(plural ? "list" : "show", "", "unknown kind '" + k + "'; valid: models, hardware, clusters, runtimes" +
                                                       (close.empty() ? "" : " (did you mean '" + close[0] + "'?)"));
  }
  return s;
}

std::string rope_summary(const ModelSpec& m) {
  int64_t rope = count_layers(m, PositionKind::rope), nope = count_layers(m, PositionKind::nope),
          alibi = count_layers(m, PositionKind::alibi);
  std::string s;
  if (rope) {
    s += std::to_string(rope) + " RoPE layers (base " + fixed(m.rope.base, 0);
    if (m.rope.scaling != RopeScaling::none)
      s += ", " + std::string(to_string(m.rope.scaling)) + " x" + fixed(m.rope.factor, 1) + " from " +
           std::to_string(m.rope.original_max_positions);
    if (m.rope.partial_rotary_factor < 1) s += ", rotary fraction " + fixed(m.rope.partial_rotary_factor, 2);
    s += ")";
  }
  if (nope) s += (s.empty() ? "" : ", ") + std::to_string(nope) + " NoPE layers";
  if (alibi) s += (s.empty() ? "" : ", ") + std::to_string(alibi) + " ALiBi layers";
  return s;
}

void show_model(const ModelSpec& m, int64_t seq) {
  std::cout << m.name << "\n  source: " << m.source << "\n\n";
  Table t;
  t.header = {"quantity", "value"};
  t.rows = {
      {"layers", std::to_string(m.layers)},
      {"hidden", std::to_string(m.hidden)},
      {"heads (query / KV)", std::to_string(m.heads) + " / " + std::to_string(m.kv_heads) +
                                 (m.kv_heads == 1 ? " (MQA)" : m.kv_heads < m.heads ? " (GQA)" : " (MHA)")},
      {"head dim", std::to_string(m.head_dim)},
      {"MLP", std::string(to_string(m.activation)) + ", width " + std::to_string(m.ffn)},
      {"vocab", std::to_string(m.vocab) + (m.tied_embeddings ? " (tied embeddings)" : " (untied head)")},
      {"norm", to_string(m.norm)},
      {"positions", rope_summary(m)},
      {"parameters", std::to_string(total_params(m)) + " (" + human_count(static_cast<double>(total_params(m))) + ")"},
      {"  per layer", std::to_string(params_per_layer(m)) + " (attention " + std::to_string(attention_params_per_layer(m)) +
                          ", MLP " + std::to_string(mlp_params_per_layer(m)) + ")"},
      {"  embedding + head", std::to_string(embedding_params(m) + head_params(m))},
      {"  non-embedding", std::to_string(nonembedding_params(m))},
      {"KV bytes / token / layer (bf16)", std::to_string(kv_bytes_per_token_per_layer(m, 2))},
      {"KV bytes / token, all layers", human_bytes(static_cast<double>(kv_bytes_per_token_per_layer(m, 2) * m.layers))},
      {"training FLOPs / token, dense (6N)", human_count(dense_train_flops_per_token(m))},
      {"training FLOPs / token, causal attn @ " + std::to_string(seq),
       human_count(causal_attention_train_flops_per_token(m, seq))},
      {"bf16 weights", human_bytes(2.0 * static_cast<double>(total_params(m)))},
      {"mixed-precision Adam states (18 B/param)", human_bytes(18.0 * static_cast<double>(total_params(m)))},
  };
  std::cout << t.render();
}

}  // namespace

std::function<int()> add_list_command(CLI::App& app, CommonOptions& common) {
  auto kind = std::make_shared<std::string>();
  app.add_option("kind", *kind, "models | hardware | clusters | runtimes")->required();
  app.footer("Examples:\n  ctxplan list models\n  ctxplan list clusters");
  return [kind, &common]() {
    Profiles p = load_profiles(common.profiles.empty() ? default_profiles_dir() : common.profiles);
    std::string k = normalise_kind(*kind, true);
    Table t;
    if (k == "models") {
      t.header = {"model", "params", "layers", "hidden", "heads/kv", "ffn", "vocab", "aliases"};
      for (size_t i = 0; i < p.models.size(); ++i) {
        auto& m = p.models[i];
        std::string al;
        for (auto& a : p.model_aliases[i]) al += (al.empty() ? "" : ", ") + a;
        t.rows.push_back({m.name, human_count(static_cast<double>(total_params(m))), std::to_string(m.layers),
                          std::to_string(m.hidden), std::to_string(m.heads) + "/" + std::to_string(m.kv_heads),
                          std::to_string(m.ffn), std::to_string(m.vocab), al});
      }
    } else if (k == "hardware") {
      t.header = {"gpu", "bf16 TFLOP/s", "fp8 TFLOP/s", "HBM GiB", "usable GiB", "HBM TB/s", "PCIe GB/s", "aliases"};
      for (auto& h : p.hardware) {
        std::string al;
        for (auto& a : h.aliases) al += (al.empty() ? "" : ", ") + a;
        t.rows.push_back({h.name, fixed(h.peak_bf16_flops / 1e12, 0), fixed(h.peak_fp8_flops / 1e12, 0),
                          gib(static_cast<double>(h.hbm_bytes), 1), gib(static_cast<double>(h.usable_bytes), 1),
                          fixed(h.hbm_bytes_per_second / 1e12, 2), fixed(h.pcie_bytes_per_second / 1e9, 0), al});
      }
    } else if (k == "clusters") {
      t.header = {"cluster", "gpu", "nodes", "gpus/node", "intra GB/s", "inter GB/s/gpu", "host GiB/node"};
      for (auto& c : p.clusters)
        t.rows.push_back({c.name, c.gpu.name, std::to_string(c.nodes), std::to_string(c.gpus_per_node),
                          fixed(c.intra_bytes_per_second / 1e9, 0), fixed(c.inter_bytes_per_second / 1e9, 0),
                          gib(static_cast<double>(c.host_bytes_per_node), 0)});
      std::cout << "(any cluster can also be written <nodes>x<gpus per node>x<gpu>, e.g. 8xh100, 16x8xh200)\n";
    } else {
      t.header = {"runtime", "description"};
      for (auto& r : p.runtimes) t.rows.push_back({r.name, r.description});
    }
    std::cout << t.render("");
    return kExitOk;
  };
}

std::function<int()> add_show_command(CLI::App& app, CommonOptions& common) {
  auto kind = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  auto seq = std::make_shared<std::string>("8192");
  app.add_option("kind", *kind, "model | hardware | cluster | runtime")->required();
  app.add_option("name", *name, "profile name, alias or path (clusters also accept 8xh100 shorthand)")->required();
  app.add_option("--seq", *seq, "sequence length for the attention FLOPs line (default 8192)");
  app.footer("Examples:\n  ctxplan show model Llama-3.1-70B\n  ctxplan show model ./config.json --seq 128k\n"
             "  ctxplan show cluster 16x8xh200\n  ctxplan show runtime hf-deepspeed");
  return [kind, name, seq, &common]() {
    Profiles p = load_profiles(common.profiles.empty() ? default_profiles_dir() : common.profiles);
    std::string k = normalise_kind(*kind, false);
    if (k == "models") {
      show_model(resolve_model(p, *name), parse_tokens(*seq, "--seq"));
    } else if (k == "hardware") {
      const HardwareSpec& h = resolve_hardware(p, *name);
      std::cout << h.name << "\n  source: " << h.source << "\n";
      Table t;
      t.header = {"quantity", "value"};
      t.rows = {{"peak dense bf16", fixed(h.peak_bf16_flops / 1e12, 1) + " TFLOP/s"},
                {"peak dense fp8", fixed(h.peak_fp8_flops / 1e12, 1) + " TFLOP/s"},
                {"HBM", human_bytes(static_cast<double>(h.hbm_bytes))},
                {"usable after context", human_bytes(static_cast<double>(h.usable_bytes))},
                {"HBM bandwidth", fixed(h.hbm_bytes_per_second / 1e12, 2) + " TB/s"},
                {"PCIe host<->device", fixed(h.pcie_bytes_per_second / 1e9, 1) + " GB/s"},
                {"default node", std::to_string(h.default_gpus_per_node) + " GPUs, NVLink " +
                                     fixed(h.nvlink_bytes_per_second / 1e9, 0) + " GB/s, network " +
                                     fixed(h.network_bytes_per_second / 1e9, 0) + " GB/s per GPU"}};
      std::string kernels;  // --attention choices with a curve on this GPU
      for (auto& a : h.kernels.attention) kernels += (kernels.empty() ? "" : ", ") + a.name;
      t.rows.push_back({"attention kernels", kernels});
      std::cout << t.render();
    } else if (k == "clusters") {
      ClusterSpec c = resolve_cluster(p, *name);
      std::cout << c.name << " (" << c.source << ")\n";
      Table t;
      t.header = {"quantity", "value"};
      t.rows = {{"GPUs", std::to_string(world_size(c)) + " x " + c.gpu.name},
                {"nodes x GPUs per node", std::to_string(c.nodes) + " x " + std::to_string(c.gpus_per_node)},
                {"intra-node", fixed(c.intra_bytes_per_second / 1e9, 0) + " GB/s per GPU, " +
                                   fixed(c.intra_latency_seconds * 1e6, 1) + " us"},
                {"inter-node", fixed(c.inter_bytes_per_second / 1e9, 0) + " GB/s per GPU, " +
                                   fixed(c.inter_latency_seconds * 1e6, 1) + " us"},
                {"host memory per node", human_bytes(static_cast<double>(c.host_bytes_per_node))}};
      std::cout << t.render();
    } else {
      const RuntimeProfile& r = resolve_runtime(p, *name);
      std::cout << r.name << ": " << r.description << "\n";
      std::string runs;
      for (auto& k : r.attention_kernels) runs += (runs.empty() ? "" : ", ") + k;
      std::cout << "attention: default " << r.attention_kernel << "; --attention may name: " << runs << "\n";
      // its variants (framework versions that change some constants): --runtime <name>@<variant>
      for (const RuntimeVariantInfo& v : runtime_variants(p, r.name.substr(0, r.name.find('@'))))
        std::cout << "variant " << v.name << ": " << v.description << "\n";
      if (r.capabilities.declared) {  // what the stack runs: the search proposes only these plans
        Table ct;
        ct.header = {"capability", "runs", "source"};
        for (auto& row : capability_rows(r.capabilities)) ct.rows.push_back(row);
        std::cout << "what the stack can run (plan, maxseq, sweep, budget and the GUI propose only these plans):\n" << ct.render() << "\n";
      } else {
        std::cout << "capabilities: not stated (every plan the cost model prices is proposed)\n";
      }
      Table t;
      t.header = {"constant", "source"};
      for (auto& [key, src] : r.sources) t.rows.push_back({key, src});
      std::cout << t.render();
    }
    return kExitOk;
  };
}

}  // namespace ctx
