// Runs ctxplan-gui headless (under xvfb-run when there is no display) on a state document and
// reads back what it wrote: the exit code, stderr, the state report and the PNG's pixels.
// Tests use the pixels only to prove that a region was drawn (not blank, expected colours).
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ctx::gui::test {

using json = nlohmann::json;

// Why headless runs cannot happen here ("" when they can): no xvfb-run and no $DISPLAY.
std::string headless_unavailable();

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes a pixel
  bool empty() const { return rgb.empty(); }
  // Pixels within `tolerance` (per channel) of `color` inside the rectangle [x0,y0,x1,y1].
  int64_t count_color(const std::array<float, 4>& rect, std::array<int, 3> color, int tolerance = 3) const;
  // Distinct colours inside the rectangle (capped at 4096).
  int64_t distinct_colors(const std::array<float, 4>& rect) const;
  std::array<float, 4> whole() const { return {0, 0, static_cast<float>(width), static_cast<float>(height)}; }
};

struct GuiRun {
  int exit_code = -1;
  std::string err;        // stderr
  std::string dir;        // where the files are
  json report;            // <name>.report.json (null when missing)
  Image image;            // <name>.png (empty when missing)
  std::array<float, 4> region(const std::string& name) const;  // from report.regions; zero when missing
};

// A fresh directory for one test under the system temp folder.
std::string fresh_dir(const std::string& name);

// Writes `state` to <dir>/<name>.state.json (unless null), runs the GUI with --screenshot
// <dir>/<name>.png, --profiles <source>/profiles (unless `extra` names other profiles) and `extra` arguments, with <dir> as the working
// directory, and reads the results back.
GuiRun run_gui(const std::string& dir, const std::string& name, const json& state, const std::vector<std::string>& extra = {});

// Runs a program (argv[0] a path), returns its exit code and standard output.
int run_program(const std::vector<std::string>& argv, std::string* out, const std::string& cwd = "");

}  // namespace ctx::gui::test
