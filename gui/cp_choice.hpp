// The context-parallel axes a person picks for the selected plan in the header (issue 20):
// cp_comm, cp_layout, cp_varlen (with split:k's k) and, for a2a+p2p, the Ulysses degree. The
// choice is applied to the plan's text; whether the combination is allowed is decided by the cost
// model's own parser and plan_check when the App predicts it (the reason lands in errors["plan"]),
// never here.
#pragma once
#include <cstdint>
#include <string>

#include "costmodel/plan.hpp"

namespace ctx::gui {

struct CpChoice {
  CpComm comm = CpComm::p2p;
  CpLayout layout = CpLayout::headtail;
  CpVarlen::Kind varlen = CpVarlen::Kind::native;
  int64_t split_k = 4;   // split:<k>'s sub-packs (kept while another strategy is picked; 4 as the search tries)
  int64_t ulysses = 0;   // a2a+p2p's Ulysses degree (0 = unset: plan_check asks for it)
};

// The plan's axes as the controls show them.
CpChoice cp_choice_of(const Plan& p);

// `base` with the choice's axes, as key=value text (plan_to_string). The Ulysses degree is written
// only for a2a+p2p (the one exchange whose key it is); every other key of `base` is kept.
std::string plan_text_with(Plan base, const CpChoice& c);

}  // namespace ctx::gui
