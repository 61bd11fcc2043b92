// Checks a plan against a model, a cluster and a sequence length: fills the defaults (dp),
// rejects what cannot run with the reason, flags what runs but is unwise, and proposes the
// nearest valid alternatives.
#pragma once
#include <string>
#include <vector>

#include "costmodel/hardware_spec.hpp"
#include "costmodel/model_spec.hpp"
#include "costmodel/plan.hpp"

namespace ctx {

struct PlanCheck {
  std::vector<std::string> errors;        // the plan cannot run
  std::vector<std::string> warnings;      // it runs, but a person should know
  std::vector<std::string> alternatives;  // nearest valid plans or inputs, as `key=value` edits
  bool ok() const { return errors.empty(); }
  std::string message() const;            // errors, then "nearest valid: ..."
};

// Resolves dp (0 = fill) in place and checks everything. Never throws.
PlanCheck check_plan(Plan& p, const ModelSpec& m, const ClusterSpec& c, int64_t seq);

// Largest sequence a plan's sharding accepts that is <= seq (for max-seq searches and hints).
int64_t seq_granule(const Plan& p);

}  // namespace ctx
