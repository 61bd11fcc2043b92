#include "executor/schedule_trace.hpp"

namespace ctx::exec {

const char* to_string(SimPass p) {
  switch (p) {
    case SimPass::forward: return "forward";
    case SimPass::recompute: return "recompute";
    case SimPass::backward: return "backward";
    case SimPass::optimizer: return "optimizer";
  }
  return "?";
}

json schedule_to_json(const std::vector<ScheduleEvent>& events) {
  json ev = json::array();
  for (const auto& e : events)
    ev.push_back({{"name", e.name}, {"stream", ctx::to_string(e.stream)}, {"layer", e.layer}, {"pass", to_string(e.pass)},
                  {"micro_batch", e.micro_batch}});
  return {{"schema", "ctxrun.schedule/1"}, {"events", ev}};
}

}  // namespace ctx::exec
