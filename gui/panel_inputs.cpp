// The inputs pane: model, cluster (with hand edits), runtime, sequence length on a log slider,
// global batch, document lengths, and the search's constraints. Every committed change calls
// App::inputs_changed; the prediction follows within the same frame (layout.cpp).
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cmath>

#include "costmodel/attention_kernels.hpp"
#include "costmodel/runtime_variants.hpp"
#include "gui/panels.hpp"
#include "planner/format.hpp"

namespace ctx::gui {
namespace {

// A text field whose edits count once committed (Enter or leaving the field).
bool text_commit(const char* label, std::string* s, const char* hint = nullptr) {
  const bool enter = hint ? ImGui::InputTextWithHint(label, hint, s, ImGuiInputTextFlags_EnterReturnsTrue)
                          : ImGui::InputText(label, s, ImGuiInputTextFlags_EnterReturnsTrue);
  return enter || ImGui::IsItemDeactivatedAfterEdit();
}

// A token count typed as text ("128k", "1m"); the text stays while it does not parse.
bool tokens_field(App& app, const char* label, const char* field, std::string* text, int64_t* value, bool zero_ok) {
  // follow the value (slider, state file) unless the person is typing here
  if (!ImGui::IsAnyItemActive() && *text != std::to_string(*value)) *text = std::to_string(*value);
  if (!text_commit(label, text)) return false;
  try {
    int64_t v = (zero_ok && (text->empty() || *text == "0")) ? 0 : parse_tokens(*text, field);
    *value = v;
    *text = std::to_string(v);
    return true;
  } catch (const InputError& e) {
    app.set_error("inputs", InputError(kInputsWhere, field, e.what()));
    return false;
  }
}

void section(const char* title) {
  ImGui::Spacing();
  ImGui::TextColored(ImVec4(0.55f, 0.75f, 1.0f, 1), "%s", title);
  ImGui::Separator();
}

bool model_inputs(App& app) {
  Inputs& in = app.state.inputs;
  bool changed = false;
  section("Model");
  if (ImGui::BeginCombo("profile##model", in.model.c_str())) {
    for (auto& m : app.profiles.models)
      if (ImGui::Selectable(m.name.c_str(), m.name == in.model)) {
        in.model = m.name;
        changed = true;
      }
    ImGui::EndCombo();
  }
  static std::string path;
  ImGui::SetNextItemWidth(-60);
  text_commit("##configpath", &path, "path to a Hugging Face config.json");
  ImGui::SameLine();
  if (ImGui::Button("Open")) {
    in.model = path;
    changed = true;
  }
  // a training stack's configuration: model, sequence, runtime, precision and the plan at once
  static int stack_index = 0;
  static std::string stack_path;
  static const char* const kStacks[] = {"megatron", "torchtitan", "deepspeed", "arctic"};
  ImGui::SetNextItemWidth(100);
  ImGui::Combo("##openstack", &stack_index, kStacks, 4);
  ImGui::SameLine();
  ImGui::SetNextItemWidth(-60);
  text_commit("##stackpath", &stack_path, "Megatron args / torchtitan TOML / DeepSpeed JSON / Arctic YAML");
  ImGui::SameLine();
  if (ImGui::Button("Open##stack")) app.open_stack_config(kStacks[stack_index], stack_path, ImGui::GetTime());
  if (app.job) {
    const ModelSpec& m = app.job->model;
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("%s: %lld layers, hidden %lld, %lld/%lld heads, %s params", m.name.c_str(), static_cast<long long>(m.layers),
                        static_cast<long long>(m.hidden), static_cast<long long>(m.heads), static_cast<long long>(m.kv_heads),
                        human_count(static_cast<double>(total_params(m))).c_str());
    ImGui::PopStyleColor();
  }
  return changed;
}

bool cluster_inputs(App& app) {
  Inputs& in = app.state.inputs;
  ClusterEdit& e = in.cluster_edit;
  bool changed = false;
  section("Cluster");
  if (ImGui::BeginCombo("profile##cluster", in.cluster.c_str())) {
    for (auto& c : app.profiles.clusters)
      if (ImGui::Selectable(c.name.c_str(), c.name == in.cluster)) {
        in.cluster = c.name;
        changed = true;
      }
    ImGui::EndCombo();
  }
  changed |= text_commit("name or NxGxgpu", &in.cluster);
  if (ImGui::Checkbox("edit the cluster", &e.enabled)) {
    if (e.enabled && app.job) {  // start from what is resolved now
      const ClusterSpec& c = app.job->cluster;
      e.nodes = c.nodes;
      e.gpus_per_node = c.gpus_per_node;
      e.gpu = c.gpu.name;
      e.intra_gbps = c.intra_bytes_per_second / 1e9;
      e.inter_gbps = c.inter_bytes_per_second / 1e9;
      e.host_gib_per_node = static_cast<double>(c.host_bytes_per_node) / (1024.0 * 1024 * 1024);
    }
    changed = true;
  }
  if (e.enabled) {
    ImGui::Indent();
    const int64_t one = 1;
    changed |= ImGui::InputScalar("nodes", ImGuiDataType_S64, &e.nodes, &one);
    changed |= ImGui::InputScalar("GPUs per node", ImGuiDataType_S64, &e.gpus_per_node, &one);
    e.nodes = std::clamp<int64_t>(e.nodes, 1, 1 << 20);
    e.gpus_per_node = std::clamp<int64_t>(e.gpus_per_node, 1, 1024);
    if (ImGui::BeginCombo("GPU", e.gpu.c_str())) {
      for (auto& h : app.profiles.hardware)
        if (ImGui::Selectable(h.name.c_str(), h.name == e.gpu)) {
          e.gpu = h.name;
          changed = true;
        }
      ImGui::EndCombo();
    }
    changed |= ImGui::InputDouble("intra-node GB/s", &e.intra_gbps, 0, 0, "%.1f", ImGuiInputTextFlags_EnterReturnsTrue);
    changed |= ImGui::InputDouble("inter-node GB/s", &e.inter_gbps, 0, 0, "%.1f", ImGuiInputTextFlags_EnterReturnsTrue);
    changed |= ImGui::InputDouble("host GiB/node", &e.host_gib_per_node, 0, 0, "%.0f", ImGuiInputTextFlags_EnterReturnsTrue);
    for (double* v : {&e.intra_gbps, &e.inter_gbps, &e.host_gib_per_node}) *v = std::max(0.0, *v);
    ImGui::Unindent();
  }
  if (app.job) {
    const ClusterSpec& c = app.job->cluster;
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    ImGui::TextWrapped("%lld x %lld %s, %.0f GiB usable; links %.0f / %.0f GB/s; host %.0f GiB/node",
                        static_cast<long long>(c.nodes), static_cast<long long>(c.gpus_per_node), c.gpu.name.c_str(),
                        static_cast<double>(c.gpu.usable_bytes) / (1024.0 * 1024 * 1024), c.intra_bytes_per_second / 1e9,
                        c.inter_bytes_per_second / 1e9, static_cast<double>(c.host_bytes_per_node) / (1024.0 * 1024 * 1024));
    ImGui::PopStyleColor();
  }
  if (ImGui::BeginCombo("runtime", in.runtime.c_str())) {
    // the variants are read from the profile files once per profiles folder, not every frame
    static std::string variants_dir;
    static std::vector<RuntimeVariantInfo> variants;
    if (variants_dir != app.profiles.dir) {
      variants = runtime_variants(app.profiles);
      variants_dir = app.profiles.dir;
    }
    for (auto& r : app.profiles.runtimes) {
      if (ImGui::Selectable(r.name.c_str(), r.name == in.runtime)) {
        in.runtime = r.name;
        changed = true;
      }
      // its variants (a framework version that changes some constants, as --runtime NAME@VARIANT)
      for (const RuntimeVariantInfo& v : variants) {
        if (v.name.compare(0, r.name.size() + 1, r.name + "@") != 0) continue;
        if (ImGui::Selectable(("  " + v.name).c_str(), v.name == in.runtime)) {
          in.runtime = v.name;
          changed = true;
        }
        if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", v.description.c_str());
      }
    }
    ImGui::EndCombo();
  }
  return changed;
}

// The attention implementation, as the CLI's --attention: the runtime's default first, then every
// kernel the cost model knows. A kernel the job cannot price (one the runtime does not run, no curve
// on this GPU) is greyed with the cost model's reason; chosen anyway, that reason shows under the
// combo and the previous inputs stay (resolve_inputs refuses it as the CLI does).
bool attention_inputs(App& app) {
  Inputs& in = app.state.inputs;
  bool changed = false;
  const ResolvedJob* job = app.job ? &*app.job : nullptr;
  const std::string default_label =
      "runtime default (" + (job ? (job->attention_default_here.empty() ? job->attention_default : job->attention_default_here) : "?") + ")";
  const std::string current = in.attention.empty() ? default_label : in.attention;
  if (ImGui::BeginCombo("attention", current.c_str())) {
    if (ImGui::Selectable(default_label.c_str(), in.attention.empty())) {
      changed = !in.attention.empty();
      in.attention.clear();
    }
    for (const AttentionKernelInfo& k : attention_kernel_catalogue()) {
      const std::string why = job ? attention_unavailable(*job, k.name) : "";
      if (!why.empty()) ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
      if (ImGui::Selectable(k.name.c_str(), in.attention == k.name)) {
        changed = in.attention != k.name;
        in.attention = k.name;
      }
      if (!why.empty()) ImGui::PopStyleColor();
      if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s%s%s", k.what.c_str(), why.empty() ? "" : "\n", why.c_str());
    }
    ImGui::EndCombo();
  }
  // the reason a choice cannot be priced (resolve_inputs' error), else what is priced and its curve's source
  std::string error;
  auto it = app.errors.find("inputs");
  if (it != app.errors.end() && (it->second.field == "attention" || it->second.field == "constants.attention_kernel"))
    error = it->second.message;
  json shown = {{"choice", in.attention}, {"label", current}, {"error", error}};
  if (!error.empty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(0.95f, 0.4f, 0.4f, 1));
    ImGui::TextWrapped("%s", error.c_str());
    ImGui::PopStyleColor();
  } else if (job) {
    const AttentionKernel& k = job->attention;
    std::string what;
    for (const AttentionKernelInfo& i : attention_kernel_catalogue())
      if (i.name == k.name) what = i.what;
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    if (in.attention.empty() && job->attention_default != k.name)  // "ctxrun_mma|fa2": the first with a curve here
      ImGui::TextWrapped("%s's default %s prices %s (the first with a curve on %s)", in.runtime.c_str(), job->attention_default.c_str(),
                         k.name.c_str(), job->cluster.gpu.name.c_str());
    ImGui::TextWrapped("%s: %s", k.name.c_str(), what.c_str());
    ImGui::TextWrapped("curve: %s", k.source.c_str());
    ImGui::PopStyleColor();
    shown["in_force"] = k.name;
    shown["source"] = k.source;
  }
  app.shown["attention"] = shown;
  return changed;
}

bool sequence_inputs(App& app) {
  Inputs& in = app.state.inputs;
  bool changed = false;
  section("Sequence and batch");
  // log2 slider from 4K to 16M, snapped to multiples of 1K tokens
  float exponent = static_cast<float>(std::log2(static_cast<double>(std::max<int64_t>(in.seq_tokens, 1))));
  std::string shown = tokens_text(in.seq_tokens) + " tokens";
  if (ImGui::SliderFloat("##seqslider", &exponent, 12.0f, 24.0f, shown.c_str(), ImGuiSliderFlags_NoRoundToFormat)) {
    const double t = std::pow(2.0, static_cast<double>(exponent));
    in.seq_tokens = std::clamp<int64_t>(static_cast<int64_t>(std::llround(t / 1024.0)) * 1024, 4096, int64_t(1) << 24);
    changed = true;
  }
  static std::string seq_text, gbt_text;
  if (changed) seq_text = std::to_string(in.seq_tokens);
  changed |= tokens_field(app, "sequence (128k, 1m)", "seq", &seq_text, &in.seq_tokens, false);
  changed |= tokens_field(app, "global batch tokens", "global_batch_tokens", &gbt_text, &in.global_batch_tokens, true);
  ImGui::TextDisabled("0 = one sequence per data-parallel rank");
  return changed;
}

bool document_inputs(App& app) {
  Inputs& in = app.state.inputs;
  bool changed = false;
  section("Documents in a sequence");
  int mode = static_cast<int>(in.docs);
  changed |= ImGui::RadioButton("one document (causal)", &mode, 0);
  changed |= ImGui::RadioButton("fixed length", &mode, 1);
  ImGui::SameLine();
  changed |= ImGui::RadioButton("histogram", &mode, 2);
  in.docs = static_cast<DocMode>(mode);
  if (in.docs == DocMode::fixed) {
    changed |= ImGui::InputScalar("tokens per document", ImGuiDataType_S64, &in.doc_tokens, nullptr, nullptr, nullptr,
                                  ImGuiInputTextFlags_EnterReturnsTrue);
    in.doc_tokens = std::max<int64_t>(1, in.doc_tokens);
  } else if (in.docs == DocMode::histogram) {
    double sum = 0;
    int remove = -1;
    if (ImGui::BeginTable("bins", 3, ImGuiTableFlags_SizingStretchProp)) {
      ImGui::TableSetupColumn("up to tokens");
      ImGui::TableSetupColumn("fraction");
      ImGui::TableSetupColumn("", ImGuiTableColumnFlags_WidthFixed, 24);
      ImGui::TableHeadersRow();
      for (size_t i = 0; i < in.doc_bins.size(); ++i) {
        ImGui::PushID(static_cast<int>(i));
        ImGui::TableNextRow();
        ImGui::TableNextColumn();
        ImGui::SetNextItemWidth(-1);
        changed |= ImGui::InputScalar("##t", ImGuiDataType_S64, &in.doc_bins[i].tokens, nullptr, nullptr, nullptr,
                                      ImGuiInputTextFlags_EnterReturnsTrue);
        ImGui::TableNextColumn();
        ImGui::SetNextItemWidth(-1);
        changed |= ImGui::InputDouble("##f", &in.doc_bins[i].fraction, 0, 0, "%.3f", ImGuiInputTextFlags_EnterReturnsTrue);
        ImGui::TableNextColumn();
        if (ImGui::SmallButton("x")) remove = static_cast<int>(i);
        sum += in.doc_bins[i].fraction;
        ImGui::PopID();
      }
      ImGui::EndTable();
    }
    if (remove >= 0) {
      in.doc_bins.erase(in.doc_bins.begin() + remove);
      changed = true;
    }
    if (ImGui::SmallButton("add bin")) {
      in.doc_bins.push_back({in.doc_bins.empty() ? 4096 : in.doc_bins.back().tokens * 2, 0});
      changed = true;
    }
    ImGui::SameLine();
    ImGui::TextColored(std::abs(sum - 1) < 1e-6 ? ImVec4(0.6f, 0.6f, 0.6f, 1) : ImVec4(0.95f, 0.4f, 0.4f, 1), "fractions sum to %.3f", sum);
  }
  changed |= ImGui::Checkbox("sorted packing (balance DP ranks)", &in.sorted_packing);
  {  // the dtype of weights, activations and their communication (plan key precision)
    static const char* kPrecisions[] = {"bf16", "fp8", "fp32"};
    int cur = 0;
    for (int i = 0; i < 3; ++i)
      if (in.precision == kPrecisions[i]) cur = i;
    if (ImGui::Combo("precision", &cur, kPrecisions, 3)) {
      in.precision = kPrecisions[cur];
      changed = true;
    }
  }
  return changed;
}

bool constraint_inputs(App& app) {
  Inputs& in = app.state.inputs;
  bool changed = false;
  section("Search constraints");
  ImGui::TextUnformatted("CP kinds:");
  for (int i = 0; i < kCpKinds; ++i) {
    if (i != 3) ImGui::SameLine();  // two rows: ring zigzag allgather / ulysses usp
    bool on = in.cp_kinds[i];
    if (ImGui::Checkbox(cp_kind_name(i).c_str(), &on)) {
      in.cp_kinds[i] = on;
      changed = true;
    }
  }
  changed |= ImGui::Checkbox("allow CPU offload", &in.allow_offload);
  changed |= text_commit("TP degrees", &in.tp_values, "all, or 1,2,4,8");
  changed |= text_commit("CP degrees", &in.cp_values, "all, or 8,16,32");
  changed |= text_commit("PP stages", &in.pp_values, "1,2,4,... up to 16 (divisors of the layers)");
  {  // the pipeline split every plan keeps (Megatron's uneven stages; the plan keys of pipeline_stages.hpp)
    auto count = [&changed](const char* label, int64_t* v, const char* tip) {
      int64_t x = *v;
      if (ImGui::InputScalar(label, ImGuiDataType_S64, &x, nullptr, nullptr, nullptr, ImGuiInputTextFlags_EnterReturnsTrue) && x != *v) {
        *v = x;
        changed = true;
      }
      if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", tip);
    };
    count("PP virtual stages", &in.vpp, "vpp: model chunks per rank (interleaved 1F1B); 0 = the search's choice");
    count("PP first stage layers", &in.pp_first,
          "pp_first (Megatron --decoder-first-pipeline-num-layers): the first stage's layers, the rest even; 0 = even split");
    count("PP last stage layers", &in.pp_last,
          "pp_last (--decoder-last-pipeline-num-layers): the last stage's layers; 0 = even split");
    changed |= ImGui::Checkbox("embedding takes a layer's place (pp_embed)", &in.pp_embed);
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("--account-for-embedding-in-pipeline-split: the first chunk builds one layer fewer");
    changed |= ImGui::Checkbox("loss takes a layer's place (pp_loss)", &in.pp_loss);
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("--account-for-loss-in-pipeline-split: the last chunk builds one layer fewer");
  }
  changed |= text_commit("fixed keys", &in.fixed_keys, "plan keys every plan keeps, e.g. tp=1,cp_kind=ulysses");
  int objective = in.objective_memory ? 1 : 0;
  ImGui::TextUnformatted("rank by:");
  ImGui::SameLine();
  changed |= ImGui::RadioButton("time", &objective, 0);
  ImGui::SameLine();
  changed |= ImGui::RadioButton("memory", &objective, 1);
  in.objective_memory = objective == 1;
  changed |= ImGui::SliderInt("simulated finalists", &in.refine, 0, 1000);
  return changed;
}

}  // namespace

void draw_inputs_panel(App& app, double now) {
  ImGui::PushItemWidth(-150);  // room for the labels on the right
  bool changed = false;
  changed |= model_inputs(app);
  changed |= cluster_inputs(app);
  changed |= attention_inputs(app);
  changed |= sequence_inputs(app);
  changed |= document_inputs(app);
  changed |= constraint_inputs(app);
  ImGui::PopItemWidth();
  if (changed) app.inputs_changed(now);
  ImGui::Spacing();
  ImGui::Separator();
  if (ImGui::Button("Reload profiles")) app.reload_profiles();
  ImGui::SameLine();
  ImGui::TextDisabled("%s", app.profiles.dir.c_str());
}

}  // namespace ctx::gui
