// The ctxplan subcommands. Each registers its options on the CLI and runs on the parsed values.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>

namespace ctx {

struct CommonOptions {
  std::string profiles;  // profiles folder; empty = default_profiles_dir()
};

// Each returns the callback to run when that subcommand was chosen; the callback returns the exit code.
std::function<int()> add_predict_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_list_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_show_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_simulate_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_plan_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_maxseq_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_sweep_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_budget_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_validate_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_calibrate_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_compare_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_launch_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_import_command(CLI::App& app, CommonOptions& common);
std::function<int()> add_export_command(CLI::App& app, CommonOptions& common);

}  // namespace ctx
