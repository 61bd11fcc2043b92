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
// check_plan(p, m, c, seq).ok() with p filled the same way, without building any error, warning or
// alternative (the same rules, plan_check.cpp check_rules): what the search asks of every plan.
bool plan_valid(Plan& p, const ModelSpec& m, const ClusterSpec& c, int64_t seq);

// The multiple of which a plan's sharding needs the sequence: 2*cp for head-tail layouts, else
// cp (times tp under SP). Max-seq searches step in it.
int64_t seq_granule(const Plan& p);

// The sequence length a plan is priced at: with pad=1, seq rounded up to a multiple of
// seq_granule (the pad tokens are computed, stored and sent like real ones); else seq itself.
// The memory and step models price this length; tokens/s counts `seq` (step_model.cpp).
int64_t padded_seq(const Plan& p, int64_t seq);

}  // namespace ctx
