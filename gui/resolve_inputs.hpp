// Turns the explorer's inputs into what the libraries take: model, cluster (with hand edits),
// runtime, the base plan (mask, packing, precision) and the search request. Bad input throws
// InputError naming the file or input and the field, exactly as the CLI would.
#pragma once
#include <string>

#include "costmodel/profile_store.hpp"
#include "gui/gui_state.hpp"
#include "planner/search.hpp"

namespace ctx::gui {

struct ResolvedJob {
  ModelSpec model;
  ClusterSpec cluster;
  RuntimeProfile runtime;
  Plan base;                   // mask, documents, packing, precision from the inputs
  int64_t seq_tokens = 0;
  SearchRequest request;       // the search over this job with the inputs' constraints
  std::string key;             // equal keys: the same job (restart searches only when it changes)
};

// Where errors about the explorer's own inputs point ("inputs" + field).
constexpr const char* kInputsWhere = "inputs";

ResolvedJob resolve_inputs(const Profiles& profiles, const Inputs& in);

// The selected plan: `text` parsed, with the job's mask/documents/packing/precision applied; a
// combination the parser refuses (cp_varlen without a document mask) throws its InputError.
Plan selected_plan(const ResolvedJob& job, const std::string& text);

// "1,2,4" -> {1,2,4}; errors name the field.
std::vector<int64_t> parse_degree_list(const std::string& text, const std::string& field);

}  // namespace ctx::gui
