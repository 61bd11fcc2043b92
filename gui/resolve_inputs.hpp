// Turns the explorer's inputs into what the libraries take: model, cluster (with hand edits),
// runtime, the base plan (mask, packing, precision) and the search request. Bad input throws
// InputError naming the file or input and the field, exactly as the CLI would.
#pragma once
#include <string>

#include "costmodel/hardware_spec.hpp"
#include "costmodel/profile_store.hpp"
#include "gui/gui_state.hpp"
#include "planner/search.hpp"

namespace ctx::gui {

struct ResolvedJob {
  ModelSpec model;
  ClusterSpec cluster;
  RuntimeProfile runtime;      // with the inputs' attention kernel in force (as the CLI's --attention)
  // The attention implementation: the runtime's default as its profile states it ("ctxrun_mma|fa2":
  // the first with a curve on the GPU is priced), and the kernel priced here, with its curve's source.
  std::string attention_default;
  std::string attention_default_here;  // the kernel the default prices on this GPU ("" when none of them has a curve)
  AttentionKernel attention;
  Plan base;                   // mask, documents, packing, precision from the inputs
  int64_t seq_tokens = 0;
  SearchRequest request;       // the search over this job with the inputs' constraints
  std::string key;             // equal keys: the same job (restart searches only when it changes)
};

// Where errors about the explorer's own inputs point ("inputs" + field).
constexpr const char* kInputsWhere = "inputs";

ResolvedJob resolve_inputs(const Profiles& profiles, const Inputs& in);

// The inputs' pipeline split as plan keys ("vpp=2,pp_first=6,pp_embed=1"; "" when none is set),
// which resolve_inputs puts among the search's fixed keys. Throws InputError naming
// inputs.constraints.<key> for a negative value.
std::string pipeline_split_keys(const Inputs& in);

// The runtime with the attention implementation `name` in force for this cluster and base plan
// ("" = the runtime's default), through the CLI's functions (attention_kernels.hpp with_attention,
// find_attention_kernel, attention_mask). Throws their InputError, naming inputs and field
// "attention" (a kernel the runtime does not run, one without a curve on this GPU, one that cannot
// run the inputs' packed documents); `kernel` receives the kernel priced.
RuntimeProfile runtime_with_attention(RuntimeProfile rt, const ClusterSpec& cluster, const Plan& base, const std::string& name,
                                      AttentionKernel* kernel = nullptr);
// Why the job could not price attention implementation `name` ("" = the runtime's default): the
// cost model's error text, or "" when it can (the picker's note beside each kernel).
std::string attention_unavailable(const ResolvedJob& job, const std::string& name);

// The selected plan: `text` parsed, with the job's mask/documents/packing/precision applied; a
// combination the parser refuses (cp_varlen without a document mask) throws its InputError.
Plan selected_plan(const ResolvedJob& job, const std::string& text);

// "1,2,4" -> {1,2,4}; errors name the field.
std::vector<int64_t> parse_degree_list(const std::string& text, const std::string& field);

}  // namespace ctx::gui
