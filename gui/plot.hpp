// Plots drawn with ImDrawList (ImPlot is not packaged): a frame with linear or log axes, ticks,
// grid, axis labels and a legend, plus the marks every panel uses (points, lines, bars, rules).
// Done once here; the panels only map their data onto a PlotFrame.
#pragma once
#include <imgui.h>

#include <string>
#include <vector>

namespace ctx::gui {

struct Axis {
  enum class Format { number, gib, tokens, seconds, count2 };  // gib: bytes shown in GiB; count2: powers of two
  Axis() = default;
  Axis(double lo_, double hi_, bool log_, std::string label_, Format format_ = Format::number)
      : lo(lo_), hi(hi_), log(log_), label(std::move(label_)), format(format_) {}
  double lo = 0, hi = 1;
  bool log = false;          // log10 scale (lo must be > 0)
  std::string label;         // drawn under (x) or beside (y) the axis
  Format format = Format::number;  // how tick values are written
  std::vector<std::string> categories;  // when set: one tick per integer 0..n-1 with these labels
};

// Tick positions for an axis: 1-2-5 steps on linear axes, powers of ten (or of two for tokens)
// on log axes. At most ~`max_ticks`.
std::vector<double> axis_ticks(const Axis& a, int max_ticks);
std::string tick_label(const Axis& a, double v);

// Lower and upper bounds padded by `frac` of the span (in log space for log axes).
void pad_axis(Axis& a, double frac);

// A plot area reserved in the current window. The frame owns an invisible button covering the
// data area, so hovered()/clicked() follow ImGui's rules (topmost item, active window).
class PlotFrame {
 public:
  // Reserves `size` (x <= 0: all available width), draws background, grid, ticks and labels.
  PlotFrame(const char* id, ImVec2 size, const Axis& x, const Axis& y, int y_ticks = 6);
  PlotFrame(const char* id, ImVec2 size, const Axis& x, const std::vector<std::string>& row_labels,
            float row_label_width);  // y is categorical: one row per label, top to bottom

  float px(double x) const;   // data -> screen
  float py(double y) const;
  double data_x(float sx) const;  // screen -> data
  double data_y(float sy) const;
  // Categorical rows: the screen band of row i.
  float row_top(int i) const;
  float row_bottom(int i) const;
  int row_at(float sy) const;  // -1 outside

  bool hovered() const { return hovered_; }
  bool clicked() const { return clicked_; }
  ImVec2 mouse() const;
  const ImVec2& inner_min() const { return inner_min_; }
  const ImVec2& inner_max() const { return inner_max_; }
  const ImVec2& outer_min() const { return outer_min_; }
  const ImVec2& outer_max() const { return outer_max_; }
  ImDrawList* draw() const { return dl_; }
  const Axis& x_axis() const { return x_; }
  const Axis& y_axis() const { return y_; }

  // Marks, clipped to the data area.
  void point(double x, double y, float radius, ImU32 color, bool filled = true) const;
  void cross(double x, double y, float radius, ImU32 color) const;
  void line(const std::vector<double>& xs, const std::vector<double>& ys, ImU32 color, float thickness = 2) const;
  void rect(double x0, double y0, double x1, double y1, ImU32 fill, ImU32 border = 0) const;
  void vrule(double x, ImU32 color, const char* label) const;  // full-height line, label at the top
  void hrule(double y, ImU32 color, const char* label) const;  // full-width line, label at the left end
  // Legend in the top-right (or top-left) corner of the data area.
  void legend(const std::vector<std::pair<std::string, ImU32>>& items, bool left = false) const;

  ~PlotFrame();

 private:
  void layout(const char* id, ImVec2 size, float left_margin);
  void draw_x_axis();
  ImDrawList* dl_ = nullptr;
  Axis x_, y_;
  std::vector<std::string> rows_;
  ImVec2 outer_min_, outer_max_, inner_min_, inner_max_;
  bool hovered_ = false, clicked_ = false;
};

// Distinct colours for categories (memory categories, streams), stable by index.
ImU32 category_color(int i, float alpha = 1.0f);
// A tooltip with the given lines (call while hovered).
void tooltip_lines(const std::vector<std::string>& lines);

}  // namespace ctx::gui
