// Above the tabs: the selected plan (editable as text, its CP axes with controls), its headline numbers, the search's progress with
// a cancel button, the actions (export plan.json, copy the ctxplan command line, save a PNG),
// and the error panel.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <filesystem>

#include "gui/panels.hpp"

namespace ctx::gui {
namespace {

// A combo over an enum's values, named by the cost model's to_string.
template <typename E, size_t N>
bool enum_combo(const char* label, E* value, const E (&values)[N], float width) {
  bool changed = false;
  ImGui::SetNextItemWidth(width);
  if (ImGui::BeginCombo(label, to_string(*value))) {
    for (E v : values)
      if (ImGui::Selectable(to_string(v), v == *value)) *value = v, changed = true;
    ImGui::EndCombo();
  }
  return changed;
}

// The selected plan's CP axes (plan.hpp: cp_comm, cp_layout, cp_varlen with split:k's k, a2a+p2p's
// Ulysses degree). A pick becomes the plan's text; the cost model's parser and plan_check judge it,
// and a combination they refuse shows their reason here (and in the error panel).
void cp_controls(App& app) {
  static const CpComm kComms[] = {CpComm::p2p, CpComm::allgather, CpComm::a2a, CpComm::a2a_p2p};
  static const CpLayout kLayouts[] = {CpLayout::contiguous, CpLayout::headtail, CpLayout::headtail_doc};
  static const CpVarlen::Kind kVarlens[] = {CpVarlen::Kind::native, CpVarlen::Kind::cycle, CpVarlen::Kind::split};
  static const char* const kVarlenNames[] = {"native", "cycle", "split:k"};
  CpChoice c = app.cp_choice;
  bool changed = false;
  ImGui::BeginGroup();
  ImGui::TextUnformatted("CP");
  ImGui::SameLine();
  changed |= enum_combo("exchange", &c.comm, kComms, 100);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("cp_comm: how K,V travel (p2p ring, all-gather, Ulysses all-to-all, Ulysses x ring)");
  ImGui::SameLine();
  changed |= enum_combo("layout", &c.layout, kLayouts, 120);
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("cp_layout: chunk c of cp | chunks c and 2cp-1-c of 2cp | every document cut in 2cp chunks, head-tail");
  ImGui::SameLine();
  int v = static_cast<int>(c.varlen);
  ImGui::SetNextItemWidth(90);
  if (ImGui::Combo("varlen", &v, kVarlenNames, 3)) c.varlen = kVarlens[v], changed = true;
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip("cp_varlen (document masks under a ring): one varlen call per ring step | the ring once per document | "
                      "k sub-packs, native in each");
  if (c.varlen == CpVarlen::Kind::split) {
    ImGui::SameLine();
    ImGui::SetNextItemWidth(80);
    changed |= ImGui::InputScalar("k", ImGuiDataType_S64, &c.split_k, nullptr, nullptr, nullptr, ImGuiInputTextFlags_EnterReturnsTrue);
  }
  if (c.comm == CpComm::a2a_p2p) {
    ImGui::SameLine();
    ImGui::SetNextItemWidth(80);
    changed |= ImGui::InputScalar("ulysses", ImGuiDataType_S64, &c.ulysses, nullptr, nullptr, nullptr, ImGuiInputTextFlags_EnterReturnsTrue);
  }
  ImGui::EndGroup();
  record_last_item(app, "header.cp");
  if (changed) app.choose_cp(c);
  const auto err = app.errors.find("plan");
  // the controls show the plan's axes, the pick, or (typed text that does not parse) the last valid plan's
  const bool last_valid = app.cp_choice_from == App::CpChoiceFrom::last_valid;
  if (last_valid) {
    ImGui::SameLine();
    ImGui::TextDisabled("(the last valid plan's axes)");
  }
  if (err != app.errors.end()) ImGui::TextColored(ImVec4(0.95f, 0.45f, 0.45f, 1), "not valid: %s", err->second.message.c_str());
  app.shown["cp_controls"] = {{"cp_comm", to_string(app.cp_choice.comm)},
                              {"cp_layout", to_string(app.cp_choice.layout)},
                              {"cp_varlen", kVarlenNames[static_cast<int>(app.cp_choice.varlen)]},
                              {"split_k", app.cp_choice.split_k},
                              {"ulysses", app.cp_choice.ulysses},
                              {"valid", err == app.errors.end()},
                              {"of_last_valid_plan", last_valid},
                              {"reason", err == app.errors.end() ? std::string() : err->second.message}};
}

}  // namespace

void draw_selected_plan_header(App& app, FrameRequests& req) {
  ImGui::TextUnformatted("Selected plan");
  ImGui::SameLine();
  ImGui::SetNextItemWidth(-1);
  if (ImGui::InputText("##plan", &app.state.plan, ImGuiInputTextFlags_EnterReturnsTrue) || ImGui::IsItemDeactivatedAfterEdit())
    app.plan_changed();
  record_last_item(app, "header.plan");
  cp_controls(app);

  if (app.have_prediction) {
    const Prediction& p = app.prediction;
    const MemoryPrediction& m = p.memory;
    ImGui::TextColored(fit_color(m.fits()), "%s", m.fits() ? "FITS" : (m.fits_device ? "HOST MEMORY EXCEEDED" : "DOES NOT FIT"));
    ImGui::SameLine();
    ImGui::Text("peak %s of %s (headroom %s) | host %s of %s per node |", gib_text(m.peak.total()).c_str(),
                gib_text(m.device_capacity_bytes).c_str(), gib_text(m.headroom_bytes()).c_str(),
                gib_text(m.host_total_bytes_per_node).c_str(), gib_text(m.host_capacity_bytes_per_node).c_str());
    ImGui::SameLine();
    if (app.time_pending) ImGui::TextDisabled("simulating the step...");
    else ImGui::Text("step %s | %.0f tokens/s | MFU %.1f%%", seconds_text(p.time.step_seconds).c_str(), p.time.tokens_per_second, p.time.mfu * 100);
    // the step time's p10-p90 band (costmodel/error_band.hpp), its basis in the tooltip
    if (!app.time_pending && p.time_band.residuals > 0) {
      ImGui::SameLine();
      ImGui::TextDisabled("(p10-p90 %s - %s%s)", seconds_text(p.time_band.low(p.time.step_seconds)).c_str(),
                          seconds_text(p.time_band.high(p.time.step_seconds)).c_str(), p.time_band.few ? ", few residuals" : "");
      if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", p.time_band.basis.c_str());
    }
    ImGui::TextDisabled("%s on %s (%lld GPUs), %s tokens, runtime %s (attention %s): %s", p.model.c_str(), p.cluster.c_str(),
                        static_cast<long long>(p.world), tokens_text(p.seq).c_str(), p.runtime.c_str(), p.attention.c_str(),
                        plan_to_string(p.plan).c_str());
  } else {
    ImGui::TextDisabled("no prediction yet");
  }

  // search status
  if (app.search_running()) {
    ImGui::ProgressBar(static_cast<float>(app.search_progress()), ImVec2(240, 0), "searching plans");
    record_last_item(app, "header.progress");
    ImGui::SameLine();
    if (ImGui::Button("Cancel search")) app.cancel_search();
  } else {
    if (ImGui::Button(app.table_current() ? "Search again" : "Search plans")) app.start_search();
    ImGui::SameLine();
    if (app.table.rows.empty()) ImGui::TextDisabled("no search yet");
    else
      ImGui::TextDisabled("%s%lld plans enumerated, %lld valid, %lld fit, %lld simulated in %.2f s%s",
                          app.table_current() ? "" : "(previous inputs) ", static_cast<long long>(app.table.enumerated),
                          static_cast<long long>(app.table.valid), static_cast<long long>(app.table.fitting),
                          static_cast<long long>(app.table.simulated), app.table.seconds, app.table.cancelled ? " (cancelled)" : "");
  }

  // actions
  std::string& export_path = app.state.view.export_path;
  std::string& png_path = app.state.view.png_path;
  ImGui::SetNextItemWidth(160);
  ImGui::InputText("##exportpath", &export_path);
  ImGui::SameLine();
  const std::string cluster_file =
      std::filesystem::path(export_path).replace_extension(".cluster.json").string();
  if (ImGui::Button("Export plan.json")) {
    try {
      app.export_plan(export_path);
      app.status = "wrote " + export_path;
      app.errors.erase("action");
    } catch (const InputError& e) {
      app.set_error("action", e);
    }
  }
  ImGui::SameLine();
  // the selected plan in a training stack's own file (planner/stacks.hpp), beside plan.json
  static int stack_index = 0;
  static const char* const kStacks[] = {"megatron", "torchtitan", "deepspeed", "arctic"};
  static const char* const kStackFiles[] = {".megatron.sh", ".torchtitan.toml", ".ds_config.json", ".arctic.yml"};
  ImGui::SetNextItemWidth(100);
  ImGui::Combo("##stack", &stack_index, kStacks, 4);
  ImGui::SameLine();
  if (ImGui::Button("Export to stack")) {
    const std::string path = std::filesystem::path(export_path).replace_extension(kStackFiles[stack_index]).string();
    try {
      std::vector<std::string> lines = app.export_to_stack(kStacks[stack_index], path);
      app.status = "wrote " + path;
      for (const auto& l : lines) app.status += "; " + l;
      app.errors.erase("action");
    } catch (const InputError& e) {
      app.set_error("action", e);
    }
  }
  ImGui::SameLine();
  if (ImGui::Button("Copy command line")) {
    req.copy_text = app.command_line(cluster_file);
    app.status = "copied: " + req.copy_text;
  }
  ImGui::SameLine();
  ImGui::SetNextItemWidth(160);
  ImGui::InputText("##pngpath", &png_path);
  ImGui::SameLine();
  if (ImGui::Button("Save PNG")) req.save_png = png_path;
  if (!app.status.empty()) {
    ImGui::SameLine();
    ImGui::TextDisabled("%s", app.status.c_str());
  }
  app.shown["header"] = {{"command_line", app.command_line(cluster_file)}};
  ImGui::Separator();
}

void draw_error_panel(App& app) {
  if (app.errors.empty()) return;
  ImGui::PushStyleColor(ImGuiCol_ChildBg, ImVec4(0.35f, 0.08f, 0.08f, 1));
  const float line = ImGui::GetTextLineHeightWithSpacing();
  const float height = std::min(8.0f, 1.6f + 2.0f * static_cast<float>(app.errors.size())) * line;
  ImGui::BeginChild("errors", ImVec2(0, height), true);
  ImGui::TextColored(ImVec4(1, 0.75f, 0.75f, 1), "Errors%s", app.using_previous_inputs ? " (showing the previous inputs)" : "");
  std::string dismiss;
  for (auto& [source, e] : app.errors) {
    ImGui::PushID(source.c_str());
    if (ImGui::SmallButton("dismiss")) dismiss = source;
    ImGui::SameLine();
    ImGui::TextWrapped("[%s] %s", source.c_str(), e.message.c_str());
    ImGui::PopID();
  }
  ImGui::EndChild();
  record_last_item(app, "errors");
  ImGui::PopStyleColor();
  if (!dismiss.empty()) app.errors.erase(dismiss);
}

}  // namespace ctx::gui
