// ctxplan: the headless planner. Subcommands live in cmd_*.cpp; exit codes in costmodel/exit_codes.hpp.
#include <iostream>
#include <vector>

#include "costmodel/errors.hpp"
#include "planner/commands.hpp"
#include "costmodel/exit_codes.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "ctxplan: predict per-GPU memory and step time of parallel plans for long-context training, and search for "
      "the best plan.\n\nExit codes: 0 ok (predict: the plan fits), 2 bad input, 3 the plan does not fit, 4 compare "
      "--fail-over-tol: a row over tolerance, 1 internal error.\nProfiles: CTXPLAN_PROFILES or --profiles names the profiles folder."};
  app.require_subcommand(0, 1);
  ctx::CommonOptions common;
  app.add_option("--profiles", common.profiles, "profiles folder (default: $CTXPLAN_PROFILES or the source tree's)");
  std::vector<std::pair<CLI::App*, std::function<int()>>> commands;
  auto* predict = app.add_subcommand("predict", "predict one plan's per-GPU and per-node memory");
  commands.push_back({predict, ctx::add_predict_command(*predict, common)});
  auto* simulate = app.add_subcommand("simulate", "simulate one plan's training step event by event (breakdown, Chrome trace)");
  commands.push_back({simulate, ctx::add_simulate_command(*simulate, common)});
  auto* plan = app.add_subcommand("plan", "search every plan: the fastest that fit, why, and the time/memory Pareto frontier");
  commands.push_back({plan, ctx::add_plan_command(*plan, common)});
  auto* maxseq = app.add_subcommand("maxseq", "the longest trainable sequence for each GPU count, with the plan");
  commands.push_back({maxseq, ctx::add_maxseq_command(*maxseq, common)});
  auto* sweep = app.add_subcommand("sweep", "best plan over a grid of sequence length x GPU count (CSV/JSON)");
  commands.push_back({sweep, ctx::add_sweep_command(*sweep, common)});
  auto* budget = app.add_subcommand("budget", "a staged context-extension recipe: best plan, wall-clock and GPU-hours per stage");
  commands.push_back({budget, ctx::add_budget_command(*budget, common)});
  auto* validate = app.add_subcommand("validate", "predict every published reference point and print the errors");
  commands.push_back({validate, ctx::add_validate_command(*validate, common)});
  auto* calibrate = app.add_subcommand("calibrate", "fit a runtime profile's efficiencies to measured runs (with leave-one-out errors)");
  commands.push_back({calibrate, ctx::add_calibrate_command(*calibrate, common)});
  auto* compare = app.add_subcommand("compare", "a prediction against a ctxrun report: memory by category, time by phase, errors");
  commands.push_back({compare, ctx::add_compare_command(*compare, common)});
  auto* launch = app.add_subcommand("launch", "the mpirun command (and a Slurm script) that runs a plan with ctxrun");
  commands.push_back({launch, ctx::add_launch_command(*launch, common)});
  auto* import_cmd = app.add_subcommand("import", "a Megatron-LM / torchtitan / DeepSpeed / ArcticTraining configuration as a ctxplan.plan/1 file");
  commands.push_back({import_cmd, ctx::add_import_command(*import_cmd, common)});
  auto* export_cmd = app.add_subcommand("export", "a plan as Megatron-LM arguments, torchtitan TOML, DeepSpeed JSON or ArcticTraining YAML, with the launch line");
  commands.push_back({export_cmd, ctx::add_export_command(*export_cmd, common)});
  auto* list = app.add_subcommand("list", "list profiles: models | hardware | clusters | runtimes");
  commands.push_back({list, ctx::add_list_command(*list, common)});
  auto* show = app.add_subcommand("show", "show one profile with derived quantities: show model M");
  commands.push_back({show, ctx::add_show_command(*show, common)});
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "ctxplan: " << e.what() << "\n(run with --help for usage)\n";
    return ctx::kExitBadInput;
  }
  try {
    for (auto& [sub, run] : commands)
      if (sub->parsed()) return run();
    // no subcommand: the built-in default job
    std::cout << "(no subcommand: running `ctxplan predict` on its built-in defaults; see ctxplan --help)\n\n";
    CLI::App dflt;
    ctx::CommonOptions c2 = common;
    auto run = ctx::add_predict_command(dflt, c2);
    dflt.parse(std::vector<std::string>{});
    return run();
  } catch (const ctx::InputError& e) {
    std::cerr << "ctxplan: error: " << e.what() << "\n";
    return ctx::kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "ctxplan: internal error: " << e.what() << "\n";
    return ctx::kExitInternal;
  }
}
