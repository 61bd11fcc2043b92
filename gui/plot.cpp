#include "gui/plot.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ctx::gui {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;
constexpr float kTopMargin = 18, kRightMargin = 12, kTickLength = 4;

// Position of v along an axis as a fraction of its span (log10 space on log axes).
double axis_fraction(const Axis& a, double v) {
  if (a.log) {
    const double lo = std::log10(std::max(a.lo, 1e-300)), hi = std::log10(std::max(a.hi, 1e-300));
    return hi > lo ? (std::log10(std::max(v, 1e-300)) - lo) / (hi - lo) : 0.5;
  }
  return a.hi > a.lo ? (v - a.lo) / (a.hi - a.lo) : 0.5;
}

double axis_value(const Axis& a, double f) {
  if (a.log) {
    const double lo = std::log10(a.lo), hi = std::log10(a.hi);
    return std::pow(10.0, lo + f * (hi - lo));
  }
  return a.lo + f * (a.hi - a.lo);
}

ImU32 text_color() { return ImGui::GetColorU32(ImGuiCol_Text); }
ImU32 grid_color() { return ImGui::GetColorU32(ImGuiCol_Border, 0.45f); }

}  // namespace

std::vector<double> axis_ticks(const Axis& a, int max_ticks) {
  std::vector<double> t;
  if (!a.categories.empty()) {
    for (size_t i = 0; i < a.categories.size(); ++i) t.push_back(static_cast<double>(i));
    return t;
  }
  if (!(a.hi > a.lo) || max_ticks < 2) return t;
  if (a.log) {
    // tokens: powers of two; everything else: powers of ten with 2 and 5 in between when few decades
    const double base = a.format == Axis::Format::tokens || a.format == Axis::Format::count2 ? 2.0 : 10.0;
    const double lo = std::floor(std::log(a.lo) / std::log(base)), hi = std::ceil(std::log(a.hi) / std::log(base));
    const int every = std::max(1, static_cast<int>(std::ceil((hi - lo) / max_ticks)));
    for (double e = lo; e <= hi; e += every) {
      const double v = std::pow(base, e);
      if (v >= a.lo * (1 - 1e-9) && v <= a.hi * (1 + 1e-9)) t.push_back(v);
      if (base == 10.0 && hi - lo <= 2)
        for (double m : {2.0, 5.0})
          if (v * m >= a.lo && v * m <= a.hi) t.push_back(v * m);
    }
    std::sort(t.begin(), t.end());
    return t;
  }
  if (a.format == Axis::Format::gib) {  // 1-2-5 steps in GiB, not in bytes
    Axis g = a;
    g.format = Axis::Format::number;
    g.lo /= kGiB, g.hi /= kGiB;
    for (double v : axis_ticks(g, max_ticks)) t.push_back(v * kGiB);
    return t;
  }
  const double raw = (a.hi - a.lo) / max_ticks;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) { step = m * mag; break; }
  const double start = std::ceil(a.lo / step) * step;
  // a range narrower than the resolution of its numbers (t1 - t0 below the ULP of t0): `v += step`
  // would never move, so the ticks are counted, not accumulated, and at most 2 x max_ticks + 2 drawn
  if (!std::isfinite(start) || !(step > 0) || start + step == start) return {a.lo};
  for (int i = 0; i <= 2 * max_ticks + 2; ++i) {
    const double v = start + static_cast<double>(i) * step;
    if (v > a.hi + step * 1e-9) break;
    t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
  }
  return t;
}

std::string tick_label(const Axis& a, double v) {
  if (!a.categories.empty()) {
    const long i = std::lround(v);
    return i >= 0 && i < static_cast<long>(a.categories.size()) ? a.categories[static_cast<size_t>(i)] : std::string();
  }
  char buf[32];
  switch (a.format) {
    case Axis::Format::gib: std::snprintf(buf, sizeof buf, "%g", std::round(v / kGiB * 100) / 100); break;
    case Axis::Format::tokens:
      if (v >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%gG", v / (1024.0 * 1024 * 1024));
      else if (v >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%gM", v / (1024.0 * 1024));
      else if (v >= 1024) std::snprintf(buf, sizeof buf, "%gK", v / 1024);
      else std::snprintf(buf, sizeof buf, "%g", v);
      break;
    case Axis::Format::seconds:
      if (std::abs(v) >= 1 || v == 0) std::snprintf(buf, sizeof buf, "%g s", v);
      else if (std::abs(v) >= 1e-3) std::snprintf(buf, sizeof buf, "%g ms", std::round(v * 1e6) / 1e3);
      else std::snprintf(buf, sizeof buf, "%g us", std::round(v * 1e9) / 1e3);
      break;
    default: std::snprintf(buf, sizeof buf, "%g", v); break;
  }
  return buf;
}

void pad_axis(Axis& a, double frac) {
  if (a.log) {
    const double lo = std::log10(a.lo), hi = std::log10(a.hi), d = std::max(hi - lo, 0.3) * frac;
    a.lo = std::pow(10.0, lo - d);
    a.hi = std::pow(10.0, hi + d);
    return;
  }
  const double d = (a.hi > a.lo ? a.hi - a.lo : std::max(1e-9, std::abs(a.hi))) * frac;
  a.lo -= d;
  a.hi += d;
}

PlotFrame::PlotFrame(const char* id, ImVec2 size, const Axis& x, const Axis& y, int y_ticks) : x_(x), y_(y) {
  // left margin: the widest y tick label
  float widest = ImGui::CalcTextSize(y.label.c_str()).x * 0.5f;
  const std::vector<double> ticks = axis_ticks(y, y_ticks);
  for (double v : ticks) widest = std::max(widest, ImGui::CalcTextSize(tick_label(y, v).c_str()).x);
  layout(id, size, widest + 10);
  for (double v : ticks) {
    const float sy = py(v);
    dl_->AddLine(ImVec2(inner_min_.x, sy), ImVec2(inner_max_.x, sy), grid_color());
    const std::string s = tick_label(y, v);
    const ImVec2 ts = ImGui::CalcTextSize(s.c_str());
    dl_->AddText(ImVec2(inner_min_.x - ts.x - 6, sy - ts.y * 0.5f), text_color(), s.c_str());
  }
  dl_->AddText(ImVec2(outer_min_.x, outer_min_.y), text_color(), y.label.c_str());
  draw_x_axis();
  dl_->PushClipRect(inner_min_, inner_max_, true);
}

PlotFrame::PlotFrame(const char* id, ImVec2 size, const Axis& x, const std::vector<std::string>& row_labels,
                     float row_label_width)
    : x_(x), rows_(row_labels) {
  y_.lo = 0;
  y_.hi = static_cast<double>(rows_.size());
  layout(id, size, row_label_width);
  for (int i = 0; i < static_cast<int>(rows_.size()); ++i) {
    const float top = row_top(i), bottom = row_bottom(i);
    if (i % 2 == 1) dl_->AddRectFilled(ImVec2(inner_min_.x, top), ImVec2(inner_max_.x, bottom), ImGui::GetColorU32(ImGuiCol_TableRowBgAlt));
    const ImVec2 ts = ImGui::CalcTextSize(rows_[i].c_str());
    dl_->PushClipRect(ImVec2(outer_min_.x, top), ImVec2(inner_min_.x - 4, bottom), true);
    dl_->AddText(ImVec2(outer_min_.x + 2, (top + bottom - ts.y) * 0.5f), text_color(), rows_[i].c_str());
    dl_->PopClipRect();
  }
  draw_x_axis();
  dl_->PushClipRect(inner_min_, inner_max_, true);
}

void PlotFrame::layout(const char* id, ImVec2 size, float left_margin) {
  dl_ = ImGui::GetWindowDrawList();
  const ImVec2 avail = ImGui::GetContentRegionAvail();
  if (size.x <= 0) size.x = std::max(100.0f, avail.x + size.x);
  if (size.y <= 0) size.y = std::max(80.0f, avail.y + size.y);
  const float line = ImGui::GetTextLineHeight();
  outer_min_ = ImGui::GetCursorScreenPos();
  outer_max_ = ImVec2(outer_min_.x + size.x, outer_min_.y + size.y);
  inner_min_ = ImVec2(outer_min_.x + left_margin, outer_min_.y + kTopMargin);
  inner_max_ = ImVec2(outer_max_.x - kRightMargin, outer_max_.y - (x_.label.empty() && x_.categories.empty() ? 1.4f : 2.6f) * line);
  dl_->AddRectFilled(inner_min_, inner_max_, ImGui::GetColorU32(ImGuiCol_FrameBg));
  dl_->AddRect(inner_min_, inner_max_, ImGui::GetColorU32(ImGuiCol_Border));
  ImGui::SetCursorScreenPos(inner_min_);
  ImGui::InvisibleButton(id, ImVec2(std::max(1.0f, inner_max_.x - inner_min_.x), std::max(1.0f, inner_max_.y - inner_min_.y)),
                         ImGuiButtonFlags_MouseButtonLeft | ImGuiButtonFlags_MouseButtonRight);
  hovered_ = ImGui::IsItemHovered();
  clicked_ = ImGui::IsItemClicked(ImGuiMouseButton_Left);
  ImGui::SetCursorScreenPos(outer_min_);
  ImGui::Dummy(size);
}

void PlotFrame::draw_x_axis() {
  const float line = ImGui::GetTextLineHeight();
  const int max_ticks = std::max(2, static_cast<int>((inner_max_.x - inner_min_.x) / 90));
  // categorical labels that would overlap their neighbours alternate between two lines
  bool stagger = false;
  if (!x_.categories.empty() && x_.categories.size() > 1) {
    const float spacing = std::abs(px(1) - px(0));
    for (auto& c : x_.categories) stagger = stagger || ImGui::CalcTextSize(c.c_str()).x > spacing - 6;
  }
  int index = 0;
  for (double v : axis_ticks(x_, max_ticks)) {
    const float sx = px(v);
    const float dy = stagger && (index++ % 2 == 1) ? line : 0;
    if (x_.categories.empty()) dl_->AddLine(ImVec2(sx, inner_min_.y), ImVec2(sx, inner_max_.y), grid_color());
    dl_->AddLine(ImVec2(sx, inner_max_.y), ImVec2(sx, inner_max_.y + kTickLength), text_color());
    const std::string s = tick_label(x_, v);
    const float w = ImGui::CalcTextSize(s.c_str()).x;
    dl_->AddText(ImVec2(sx - w * 0.5f, inner_max_.y + kTickLength + dy), text_color(), s.c_str());
  }
  if (!x_.label.empty()) {
    const float w = ImGui::CalcTextSize(x_.label.c_str()).x;
    dl_->AddText(ImVec2((inner_min_.x + inner_max_.x - w) * 0.5f, inner_max_.y + kTickLength + line * 1.15f), text_color(),
                 x_.label.c_str());
  }
}

PlotFrame::~PlotFrame() { dl_->PopClipRect(); }

float PlotFrame::px(double x) const {
  return inner_min_.x + static_cast<float>(axis_fraction(x_, x)) * (inner_max_.x - inner_min_.x);
}
float PlotFrame::py(double y) const {
  return inner_max_.y - static_cast<float>(axis_fraction(y_, y)) * (inner_max_.y - inner_min_.y);
}
double PlotFrame::data_x(float sx) const { return axis_value(x_, (sx - inner_min_.x) / std::max(1.0f, inner_max_.x - inner_min_.x)); }
double PlotFrame::data_y(float sy) const { return axis_value(y_, (inner_max_.y - sy) / std::max(1.0f, inner_max_.y - inner_min_.y)); }

float PlotFrame::row_top(int i) const {
  const float h = (inner_max_.y - inner_min_.y) / std::max<size_t>(1, rows_.size());
  return inner_min_.y + h * static_cast<float>(i);
}
float PlotFrame::row_bottom(int i) const { return row_top(i + 1); }
int PlotFrame::row_at(float sy) const {
  if (rows_.empty() || sy < inner_min_.y || sy >= inner_max_.y) return -1;
  const float h = (inner_max_.y - inner_min_.y) / static_cast<float>(rows_.size());
  return std::min(static_cast<int>(rows_.size()) - 1, static_cast<int>((sy - inner_min_.y) / h));
}

ImVec2 PlotFrame::mouse() const { return ImGui::GetIO().MousePos; }

void PlotFrame::point(double x, double y, float radius, ImU32 color, bool filled) const {
  const ImVec2 c(px(x), py(y));
  if (filled) dl_->AddCircleFilled(c, radius, color, 12);
  else dl_->AddCircle(c, radius, color, 12, 1.5f);
}

void PlotFrame::cross(double x, double y, float r, ImU32 color) const {
  const ImVec2 c(px(x), py(y));
  dl_->AddLine(ImVec2(c.x - r, c.y - r), ImVec2(c.x + r, c.y + r), color, 1.5f);
  dl_->AddLine(ImVec2(c.x - r, c.y + r), ImVec2(c.x + r, c.y - r), color, 1.5f);
}

void PlotFrame::line(const std::vector<double>& xs, const std::vector<double>& ys, ImU32 color, float thickness) const {
  std::vector<ImVec2> pts;
  pts.reserve(xs.size());
  for (size_t i = 0; i < xs.size() && i < ys.size(); ++i) pts.emplace_back(px(xs[i]), py(ys[i]));
  if (pts.size() >= 2) dl_->AddPolyline(pts.data(), static_cast<int>(pts.size()), color, 0, thickness);
}

void PlotFrame::rect(double x0, double y0, double x1, double y1, ImU32 fill, ImU32 border) const {
  const ImVec2 a(std::min(px(x0), px(x1)), std::min(py(y0), py(y1))), b(std::max(px(x0), px(x1)), std::max(py(y0), py(y1)));
  dl_->AddRectFilled(a, b, fill);
  if (border) dl_->AddRect(a, b, border);
}

void PlotFrame::vrule(double x, ImU32 color, const char* label) const {
  const float sx = px(x);
  dl_->AddLine(ImVec2(sx, inner_min_.y), ImVec2(sx, inner_max_.y), color, 2);
  if (label && *label) {
    const float w = ImGui::CalcTextSize(label).x;
    const float lx = sx + 4 + w > inner_max_.x ? sx - 4 - w : sx + 4;
    dl_->AddText(ImVec2(lx, inner_min_.y + 2), color, label);
  }
}

void PlotFrame::hrule(double y, ImU32 color, const char* label) const {  // label at the left end
  const float sy = py(y);
  dl_->AddLine(ImVec2(inner_min_.x, sy), ImVec2(inner_max_.x, sy), color, 2);
  if (label && *label) {
    const ImVec2 ts = ImGui::CalcTextSize(label);
    dl_->AddText(ImVec2(inner_min_.x + 6, sy - ts.y - 1), color, label);
  }
}

void PlotFrame::legend(const std::vector<std::pair<std::string, ImU32>>& items, bool left) const {
  if (items.empty()) return;
  const float line = ImGui::GetTextLineHeight(), box = line * 0.7f, pad = 5;
  float w = 0;
  for (auto& it : items) w = std::max(w, ImGui::CalcTextSize(it.first.c_str()).x);
  w += box + 3 * pad;
  const float h = static_cast<float>(items.size()) * line + 2 * pad;
  const ImVec2 a(left ? inner_min_.x + 6 : inner_max_.x - w - 6, inner_min_.y + 6);
  dl_->AddRectFilled(a, ImVec2(a.x + w, a.y + h), ImGui::GetColorU32(ImGuiCol_PopupBg, 0.92f));
  dl_->AddRect(a, ImVec2(a.x + w, a.y + h), ImGui::GetColorU32(ImGuiCol_Border));
  for (size_t i = 0; i < items.size(); ++i) {
    const float y = a.y + pad + static_cast<float>(i) * line;
    dl_->AddRectFilled(ImVec2(a.x + pad, y + (line - box) * 0.5f), ImVec2(a.x + pad + box, y + (line + box) * 0.5f), items[i].second);
    dl_->AddText(ImVec2(a.x + 2 * pad + box, y), text_color(), items[i].first.c_str());
  }
}

ImU32 category_color(int i, float alpha) {
  // a qualitative palette (hand-picked to stay distinct on the dark theme)
  static const float rgb[][3] = {{0.30f, 0.60f, 0.95f}, {0.95f, 0.55f, 0.20f}, {0.35f, 0.80f, 0.40f}, {0.90f, 0.30f, 0.35f},
                                 {0.65f, 0.45f, 0.90f}, {0.60f, 0.42f, 0.30f}, {0.95f, 0.50f, 0.80f}, {0.60f, 0.60f, 0.60f},
                                 {0.80f, 0.80f, 0.25f}, {0.25f, 0.80f, 0.85f}, {0.55f, 0.70f, 0.95f}, {0.95f, 0.80f, 0.55f}};
  const int n = static_cast<int>(sizeof rgb / sizeof rgb[0]);
  const float* c = rgb[((i % n) + n) % n];
  return ImGui::ColorConvertFloat4ToU32(ImVec4(c[0], c[1], c[2], alpha));
}

void tooltip_lines(const std::vector<std::string>& lines) {
  ImGui::BeginTooltip();
  for (auto& l : lines) ImGui::TextUnformatted(l.c_str());
  ImGui::EndTooltip();
}

}  // namespace ctx::gui
