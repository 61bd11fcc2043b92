#include "gui/cp_choice.hpp"

namespace ctx::gui {

CpChoice cp_choice_of(const Plan& p) {
  CpChoice c;
  c.comm = p.cp_comm;
  c.layout = p.cp_layout;
  c.varlen = p.cp_varlen.kind;
  if (p.cp_varlen.kind == CpVarlen::Kind::split) c.split_k = p.cp_varlen.split;
  c.ulysses = p.cp_comm == CpComm::a2a_p2p ? p.ulysses : 0;
  return c;
}

std::string plan_text_with(Plan base, const CpChoice& c) {
  base.cp_comm = c.comm;
  base.cp_layout = c.layout;
  base.cp_varlen.kind = c.varlen;
  base.cp_varlen.split = c.varlen == CpVarlen::Kind::split ? c.split_k : 0;
  base.ulysses = c.comm == CpComm::a2a_p2p ? c.ulysses : 0;
  return plan_to_string(base);
}

}  // namespace ctx::gui
