// What the explorer remembers: the inputs a person set, the selected plan, and the view (tab,
// pane width, window size, table filter, timeline zoom). One JSON document, schema
// "ctxplan.gui-state/1", serves three uses: the settings file persisted between runs, the
// --state file that drives a headless run, and the "inputs"/"view" part of the state report.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "costmodel/json_util.hpp"

namespace ctx::gui {

// The cluster as edited by hand on top of the chosen profile or shorthand.
struct ClusterEdit {
  bool enabled = false;
  int64_t nodes = 1;
  int64_t gpus_per_node = 8;
  std::string gpu;                 // hardware profile name; empty = the base cluster's GPU
  double intra_gbps = 0;           // per GPU, one direction, GB/s (0 = the base cluster's)
  double inter_gbps = 0;
  double host_gib_per_node = 0;
};

// How documents are packed into one sequence (the plan's mask key).
enum class DocMode { causal, fixed, histogram };
struct DocBin {
  int64_t tokens = 0;              // bin upper edge
  double fraction = 0;             // fraction of documents in the bin
};

constexpr int kCpKinds = 5;        // ring, zigzag, allgather, ulysses, usp (CpKind order)

struct Inputs {
  std::string model;               // profile name/alias, or a path to a Hugging Face config.json
  std::string cluster;             // profile name, <nodes>x<gpus>x<gpu>, or a cluster JSON path
  ClusterEdit cluster_edit;
  std::string runtime;
  std::string attention;           // attention implementation, as the CLI's --attention (fa2, fa3, ...); empty = the runtime's default
  int64_t seq_tokens = 131072;
  int64_t global_batch_tokens = 0; // 0: one sequence per data-parallel rank
  DocMode docs = DocMode::causal;
  int64_t doc_tokens = 8192;       // DocMode::fixed
  std::vector<DocBin> doc_bins{{2048, 0.8}, {32768, 0.2}};
  bool sorted_packing = false;
  std::string precision = "bf16";  // bf16 | fp8 | fp32 (the plan key)
  // constraints for the search
  std::array<bool, kCpKinds> cp_kinds{true, true, true, true, true};
  bool allow_offload = true;
  std::string tp_values, cp_values;  // "1,2,4"; empty = every valid degree
  std::string pp_values;             // pipeline stages: "1,2,4"; empty = 1 and the divisors of the layers up to 16
  // the pipeline split every searched plan keeps (plan keys vpp, pp_first, pp_last, pp_embed,
  // pp_loss; pipeline_stages.hpp): 0 / false = not set (vpp: the search's choice, pp_first/pp_last:
  // the even split); the search then tries only the pp that build it
  int64_t vpp = 0, pp_first = 0, pp_last = 0;
  bool pp_embed = false, pp_loss = false;
  std::string fixed_keys;            // plan keys every searched plan keeps ("tp=1,cp_kind=ulysses"), as the CLI's -p
  bool objective_memory = false;
  int refine = 200;  // simulated finalists (SearchRequest's default)
};

struct View {
  std::string tab = "memory";      // memory | cpwork | plans | pareto | timeline | maxseq | measured
  float left_width = 420;
  int window_width = 1600, window_height = 1000;
  std::string table_filter;
  bool fits_only = false;
  int sort_column = 0;             // PlanColumn
  bool sort_descending = false;
  double timeline_t0 = 0, timeline_t1 = 0;  // seconds; equal = the whole step
  int64_t maxseq_max_gpus = 256;
  std::string export_path = "plan.json";     // Export plan.json writes here (and <stem>.cluster.json)
  std::string png_path = "ctxplan-gui.png";  // Save PNG writes here
  bool pareto_step_time = false;   // y axis: seconds per million tokens (the frontier's measure), or step time
};

struct GuiState {
  Inputs inputs;
  std::string plan;                // the selected plan, key=value text
  View view;
  std::string measured_path;       // a ctxrun report (or any prediction-shaped JSON) to overlay
  // Headless runs only (never persisted):
  bool run_search = true;          // start the search
  int select_rank = -1;            // after the search: select the plan ranked N (0 = best)
  bool run_maxseq = false;         // compute the max-seq curve
  std::string export_plan;         // before the screenshot: export the selected plan here (sets view.export_path)
};

// Window sides accepted from the settings, a state file or --size (a huge one broke the X connection).
constexpr int kMinWindowPixels = 200;
constexpr int kMaxWindowPixels = 16384;

GuiState default_state();
std::string cp_kind_name(int i);    // "ring", ...

// The mask key the document inputs stand for ("causal", "doc:8192", "doc:hist:2048@0.8/...").
std::string mask_text(const Inputs& in);

json state_to_json(const GuiState& s, bool include_headless = false);
// Reads a state document over `base` (missing fields keep base's values); errors name `where`
// and the field path.
GuiState state_from_json(const json& j, const std::string& where, const GuiState& base);

// $XDG_CONFIG_HOME/ctxplan (or ~/.config/ctxplan); created on demand by save_settings.
std::string config_dir();
void save_state_file(const std::string& path, const GuiState& s);

}  // namespace ctx::gui
