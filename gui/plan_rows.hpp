// The plan table's data: every valid plan of the search space, fitting or not. Fitting plans come
// ranked from search_plans (closed-form time, finalists simulated); plans that do not fit are added
// with their memory only, so the table shows why they fall out. Runs on the search worker.
#pragma once
#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "planner/search.hpp"

namespace ctx::gui {

struct PlanRow {
  Plan plan;
  std::string text;               // plan_to_string
  int rank = -1;                  // position in the search's ranking (fitting plans), else -1
  bool fits = false;
  bool simulated = false;
  bool pareto = false;
  double peak_bytes = 0, capacity_bytes = 0, host_bytes_per_node = 0;
  double step_seconds = 0;        // 0 when the plan does not fit (not timed)
  double tokens_per_second = 0;
  double mfu = 0;
  std::string why;
};

struct PlanTable {
  std::vector<PlanRow> rows;      // fitting plans in rank order, then the rest in enumeration order
  int64_t enumerated = 0, valid = 0, fitting = 0, simulated = 0;
  double seconds = 0;
  bool cancelled = false;
  bool complete = false;          // a finished (not cancelled) search
  std::string no_fit_reason;
  // issue 21: plans the search left out because their layout does not divide the sequence (pad=1
  // pads it), and whether no plan fits at the runtime's own optimizer precision (the ranked plans
  // then set the lower master/grads/moments it allows): SearchResult's not_dividing, lower_precision
  int64_t not_dividing = 0;
  bool lower_precision = false;
  int64_t seq = 0;                // the searched job's sequence and runtime, for the notes' words
  std::string runtime;
  std::string job_key;            // the job it belongs to
};

PlanTable build_plan_table(const SearchRequest& req, const std::function<bool(double)>& progress);

// The search's notes above the table, worded as `ctxplan plan` prints them (planner/cmd_plan.cpp)
// with the GUI's edit: the plans left out because their layout does not divide the sequence and the
// nearest edit (pad=1 among the fixed keys), and the lower optimizer precision. Empty: nothing to say.
std::vector<std::string> search_notes(const PlanTable& t);

// Columns of the table (also the sort keys; a state file's view.sort_column is this number, so new
// columns go at the end). kColumnDisplayOrder: the order they are drawn in.
enum class PlanColumn : int { rank, plan, fits, step, tokens_per_second, mfu, peak, headroom, host, cp_layout, cp_varlen, count };
constexpr PlanColumn kColumnDisplayOrder[] = {PlanColumn::rank,      PlanColumn::plan, PlanColumn::cp_layout, PlanColumn::cp_varlen,
                                              PlanColumn::fits,      PlanColumn::step, PlanColumn::tokens_per_second,
                                              PlanColumn::mfu,       PlanColumn::peak, PlanColumn::headroom, PlanColumn::host};
static_assert(std::size(kColumnDisplayOrder) == static_cast<size_t>(PlanColumn::count), "every column is drawn once");
const char* column_name(PlanColumn c);
// The CP layout and variable-length strategy cells: "-" where they do not apply (cp = 1; no document mask).
std::string layout_cell(const Plan& p);
std::string varlen_cell(const Plan& p);
// Row indices in display order: filtered by `filter` (substring of the plan text, case-insensitive;
// several words separated by spaces must all match) and fits_only, sorted by the column.
std::vector<int> table_order(const PlanTable& t, const std::string& filter, bool fits_only, PlanColumn sort_by,
                             bool descending);

}  // namespace ctx::gui
