// The executor's schedule in the simulator's vocabulary (costmodel/simulator.hpp): every compute
// and communication task a rank issues, in issue order, with the simulator's name, stream, layer
// and pass. Off unless asked for (ctxrun --schedule-trace FILE); test_schedule compares it with the
// simulator's task graph for the same plan, stream by stream and dependency by dependency.
// Communication is recorded only where the simulator prices it (its group has more than one rank).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "costmodel/json_util.hpp"
#include "costmodel/simulator.hpp"

namespace ctx::exec {

struct ScheduleEvent {
  std::string name;
  SimStream stream = SimStream::compute;
  int layer = -1;
  SimPass pass = SimPass::forward;
  int micro_batch = 0;
};

class ScheduleTrace {
 public:
  bool enabled = false;
  int micro_batch = 0;
  int layer = -1;                   // the layer tasks are recorded under (-1: embedding, loss, optimizer)
  SimPass pass = SimPass::forward;  // the pass tasks are recorded under (the model sets both)
  // Called for every task whether or not the trace is kept (the CUDA backend names NVTX ranges
  // with it, so an nsys timeline uses the simulator's task names).
  std::function<void(const ScheduleEvent&)> on_task;
  void add(const char* name, SimStream s) { add_at(name, s, layer); }
  void add_at(const char* name, SimStream s, int64_t at_layer) {
    if (!enabled && !on_task) return;
    ScheduleEvent e{name, s, static_cast<int>(at_layer), pass, micro_batch};
    if (on_task) on_task(e);
    if (enabled) events.push_back(std::move(e));
  }
  std::vector<ScheduleEvent> events;
};

const char* to_string(SimPass p);
json schedule_to_json(const std::vector<ScheduleEvent>& events);

}  // namespace ctx::exec
