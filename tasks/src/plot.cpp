// Line plots with cairo's image surfaces and its "toy" text API (enough for labels; no font
// layout library needed). See phasor/tasks/plot.h.
#include "phasor/tasks/plot.h"

#include <cairo.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "check.h"
#include "phasor/tasks/files.h"

namespace phasor::tasks {
namespace {

using detail::fail;
constexpr const char* kOp = "write_line_plot_png";

struct Rgb {
  double r, g, b;
};
// matplotlib's tab10 palette: distinct hues that stay distinguishable for most colour vision.
constexpr std::array<Rgb, 10> kPalette = {{{31 / 255.0, 119 / 255.0, 180 / 255.0},
                                           {255 / 255.0, 127 / 255.0, 14 / 255.0},
                                           {44 / 255.0, 160 / 255.0, 44 / 255.0},
                                           {214 / 255.0, 39 / 255.0, 40 / 255.0},
                                           {148 / 255.0, 103 / 255.0, 189 / 255.0},
                                           {140 / 255.0, 86 / 255.0, 75 / 255.0},
                                           {227 / 255.0, 119 / 255.0, 194 / 255.0},
                                           {127 / 255.0, 127 / 255.0, 127 / 255.0},
                                           {188 / 255.0, 189 / 255.0, 34 / 255.0},
                                           {23 / 255.0, 190 / 255.0, 207 / 255.0}}};
constexpr double kPi = 3.14159265358979323846;
constexpr int kMarkers = 4;  // circle, square, triangle, diamond

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

struct SurfaceDeleter {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct ContextDeleter {
  void operator()(cairo_t* c) const { cairo_destroy(c); }
};

void draw_marker(cairo_t* cr, int kind, double x, double y, double r) {
  switch (kind % kMarkers) {
    case 0:
      cairo_new_sub_path(cr);
      cairo_arc(cr, x, y, r, 0, 2 * kPi);
      break;
    case 1:
      cairo_rectangle(cr, x - r, y - r, 2 * r, 2 * r);
      break;
    case 2:
      cairo_move_to(cr, x, y - 1.2 * r);
      cairo_line_to(cr, x + 1.1 * r, y + 0.8 * r);
      cairo_line_to(cr, x - 1.1 * r, y + 0.8 * r);
      cairo_close_path(cr);
      break;
    default:
      cairo_move_to(cr, x, y - 1.3 * r);
      cairo_line_to(cr, x + 1.3 * r, y);
      cairo_line_to(cr, x, y + 1.3 * r);
      cairo_line_to(cr, x - 1.3 * r, y);
      cairo_close_path(cr);
  }
  cairo_fill(cr);
}

double text_width(cairo_t* cr, const std::string& s) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  return e.x_advance;
}

void validate(const PlotSpec& spec, int width, int height) {
  if (width < 200 || width > 20000) fail(kOp, "width", "in [200, 20000]", std::to_string(width));
  if (height < 150 || height > 20000)
    fail(kOp, "height", "in [150, 20000]", std::to_string(height));
  if (spec.series.empty()) fail(kOp, "spec.series", "at least one series", "none");
  for (std::size_t i = 0; i < spec.series.size(); ++i) {
    const Series& s = spec.series[i];
    const std::string name = "spec.series[" + std::to_string(i) + "] ('" + s.label + "')";
    if (s.x.empty()) fail(kOp, name, "at least one point", "an empty series");
    if (s.x.size() != s.y.size())
      fail(kOp, name, "as many y as x values",
           std::to_string(s.x.size()) + " x and " + std::to_string(s.y.size()) + " y");
    for (double x : s.x) {
      if (!std::isfinite(x)) fail(kOp, name + ".x", "finite values", num(x));
      if (spec.log_x && x <= 0) fail(kOp, name + ".x", "positive values (log_x)", num(x));
    }
  }
  for (double t : spec.x_ticks)
    if (!std::isfinite(t) || (spec.log_x && t <= 0))
      fail(kOp, "spec.x_ticks", spec.log_x ? "positive finite values (log_x)" : "finite values",
           num(t));
  if (spec.y_range) {
    const auto [lo, hi] = *spec.y_range;
    if (!(std::isfinite(lo) && std::isfinite(hi) && lo < hi))
      fail(kOp, "spec.y_range", "finite lo < hi", "(" + num(lo) + ", " + num(hi) + ")");
  }
}

}  // namespace

std::string format_tick(double value, double step) {
  if (std::abs(value) < 1e-9 * step) value = 0;  // −1e−17 from rounding prints as 0
  const double magnitude = std::max(std::abs(value), step);
  char buf[64];
  if (magnitude >= 1e6 || magnitude < 1e-4) {
    std::snprintf(buf, sizeof buf, "%.3g", value);
  } else {
    // As many decimals as the step needs (0.2 → 1, 0.05 → 2, 100 → 0): fixed notation, so that
    // 100 does not print as 1e+02 and 0.6 not as 0.6000000000000001.
    const int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(step) - 1e-9)), 0, 10);
    std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  }
  return buf;
}

std::vector<double> nice_ticks(double lo, double hi, int max_ticks) {
  if (!(std::isfinite(lo) && std::isfinite(hi) && lo < hi))
    fail("nice_ticks", "lo, hi", "finite lo < hi", "(" + num(lo) + ", " + num(hi) + ")");
  if (max_ticks < 2) fail("nice_ticks", "max_ticks", "≥ 2", std::to_string(max_ticks));
  // Smallest step s ∈ {1, 2, 5} × 10^k with at most max_ticks multiples of s in [lo, hi]: start
  // below the range / max_ticks and go up the 1-2-5 ladder.
  const double raw = (hi - lo) / max_ticks;
  int exponent = static_cast<int>(std::floor(std::log10(raw)));
  for (int guard = 0; guard < 64; ++guard, ++exponent) {
    // step = m · 10^exponent. A tick k·step is computed as (k·m) / 10^−exponent for negative
    // exponents: both factors are exact, so the tick is the double nearest the decimal value
    // (3 · 0.2 would give 0.6000000000000001).
    const double scale = std::pow(10.0, std::abs(exponent));
    for (double m : {1.0, 2.0, 5.0}) {
      const double step = exponent < 0 ? m / scale : m * scale;
      const double first = std::ceil(lo / step - 1e-9);
      const double last = std::floor(hi / step + 1e-9);
      if (last - first + 1 <= max_ticks) {
        std::vector<double> ticks;
        for (double k = first; k <= last; k += 1)
          ticks.push_back((exponent < 0 ? k * m / scale : k * m * scale) + 0.0);  // + 0: no −0
        return ticks;
      }
    }
  }
  return {lo, hi};
}

std::vector<double> log_ticks(double lo, double hi, int max_ticks) {
  if (!(std::isfinite(lo) && std::isfinite(hi) && 0 < lo && lo < hi))
    fail("log_ticks", "lo, hi", "finite 0 < lo < hi", "(" + num(lo) + ", " + num(hi) + ")");
  if (max_ticks < 2) fail("log_ticks", "max_ticks", "≥ 2", std::to_string(max_ticks));
  const int k0 = static_cast<int>(std::floor(std::log10(lo))) - 1;
  const int k1 = static_cast<int>(std::ceil(std::log10(hi))) + 1;
  const auto inside = [&](double v) { return v >= lo * (1 - 1e-12) && v <= hi * (1 + 1e-12); };
  std::vector<double> ticks;
  for (int k = k0; k <= k1; ++k)
    for (double m : {1.0, 2.0, 5.0})
      if (inside(m * std::pow(10.0, k))) ticks.push_back(m * std::pow(10.0, k));
  if (static_cast<int>(ticks.size()) > max_ticks) {
    ticks.clear();
    for (int every = 1; every < 400; ++every) {
      ticks.clear();
      for (int k = k0; k <= k1; ++k)
        if (k % every == 0 && inside(std::pow(10.0, k))) ticks.push_back(std::pow(10.0, k));
      if (static_cast<int>(ticks.size()) <= max_ticks) break;
    }
  }
  if (ticks.size() < 2) ticks = {lo, hi};  // a range inside one 1-2-5 step: label its ends
  return ticks;
}

void write_line_plot_png(const PlotSpec& spec, const std::string& path, int width, int height) {
  validate(spec, width, height);

  // Data ranges. x over every point; y over the finite points (or the given range).
  double x_lo = std::numeric_limits<double>::infinity(), x_hi = -x_lo;
  double y_lo = x_lo, y_hi = -x_lo;
  for (const Series& s : spec.series)
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      x_lo = std::min(x_lo, s.x[i]);
      x_hi = std::max(x_hi, s.x[i]);
      if (std::isfinite(s.y[i])) {
        y_lo = std::min(y_lo, s.y[i]);
        y_hi = std::max(y_hi, s.y[i]);
      }
    }
  if (spec.y_range) {
    std::tie(y_lo, y_hi) = *spec.y_range;
  } else if (!std::isfinite(y_lo)) {  // no finite y at all: an empty [0, 1] frame
    y_lo = 0;
    y_hi = 1;
  } else {
    const double pad = y_hi > y_lo ? 0.05 * (y_hi - y_lo) : std::max(0.5, 0.05 * std::abs(y_lo));
    y_lo -= pad;
    y_hi += pad;
  }
  // A single x value: widen the axis around it (a factor 2 on a log axis).
  if (x_hi == x_lo) {
    if (spec.log_x) {
      x_lo /= 2;
      x_hi *= 2;
    } else {
      const double d = std::max(0.5, 0.05 * std::abs(x_lo));
      x_lo -= d;
      x_hi += d;
    }
  }
  const auto tx = [&](double x) { return spec.log_x ? std::log(x) : x; };
  // Ticks from the data's x range; the axis then extends 3 % on each side so that the markers at
  // the ends are not cut by the frame.
  const double x_data_lo = x_lo, x_data_hi = x_hi;
  if (spec.log_x) {
    const double f = std::exp(0.03 * (std::log(x_hi) - std::log(x_lo)));
    x_lo /= f;
    x_hi *= f;
  } else {
    const double d = 0.03 * (x_hi - x_lo);
    x_lo -= d;
    x_hi += d;
  }

  std::unique_ptr<cairo_surface_t, SurfaceDeleter> surface(
      cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height));
  std::unique_ptr<cairo_t, ContextDeleter> context(cairo_create(surface.get()));
  cairo_t* cr = context.get();
  if (cairo_status(cr) != CAIRO_STATUS_SUCCESS)
    fail(kOp, "width, height", "a surface cairo can allocate",
         std::string(cairo_status_to_string(cairo_status(cr))));
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);

  // Plot area: room for the title above, tick labels and the axis label below and to the left.
  const double font = std::clamp(height / 40.0, 10.0, 16.0);
  cairo_set_font_size(cr, font);
  std::vector<double> x_ticks;
  if (!spec.x_ticks.empty()) {  // the given ticks inside the axis
    for (double t : spec.x_ticks)
      if (t >= x_lo && t <= x_hi) x_ticks.push_back(t);
  } else {
    x_ticks = spec.log_x ? log_ticks(x_data_lo, x_data_hi, 8) : nice_ticks(x_data_lo, x_data_hi, 8);
  }
  const std::vector<double> y_ticks = nice_ticks(y_lo, y_hi, 7);
  const double x_step = x_ticks.size() > 1 ? x_ticks[1] - x_ticks[0] : x_hi - x_lo;
  const double y_step = y_ticks.size() > 1 ? y_ticks[1] - y_ticks[0] : y_hi - y_lo;
  double y_label_width = 0;
  for (double t : y_ticks)
    y_label_width = std::max(y_label_width, text_width(cr, format_tick(t, y_step)));
  const double left = 2.2 * font + y_label_width + 12;
  const double right = width - 20.0;
  const double top = spec.title.empty() ? 15.0 : 2.5 * font;
  const double bottom = height - (spec.x_label.empty() ? 2.0 : 3.6) * font - 8;
  const auto px = [&](double x) {
    return left + (tx(x) - tx(x_lo)) / (tx(x_hi) - tx(x_lo)) * (right - left);
  };
  const auto py = [&](double y) { return bottom - (y - y_lo) / (y_hi - y_lo) * (bottom - top); };

  // Grid and ticks.
  cairo_set_line_width(cr, 1);
  cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
  for (double t : x_ticks) {
    cairo_move_to(cr, std::round(px(t)) + 0.5, top);
    cairo_line_to(cr, std::round(px(t)) + 0.5, bottom);
  }
  for (double t : y_ticks) {
    cairo_move_to(cr, left, std::round(py(t)) + 0.5);
    cairo_line_to(cr, right, std::round(py(t)) + 0.5);
  }
  cairo_stroke(cr);
  cairo_set_source_rgb(cr, 0, 0, 0);
  for (double t : x_ticks) {
    // Given ticks print as given (%g); on a log axis the step between ticks varies: label each
    // with the digits its decade needs.
    const std::string label =
        !spec.x_ticks.empty() ? num(t)
        : spec.log_x ? format_tick(t, std::min(1.0, std::pow(10.0, std::floor(std::log10(t)))))
                     : format_tick(t, x_step);
    cairo_move_to(cr, std::round(px(t)) + 0.5, bottom);
    cairo_line_to(cr, std::round(px(t)) + 0.5, bottom + 5);
    cairo_stroke(cr);
    cairo_move_to(cr, px(t) - text_width(cr, label) / 2, bottom + 6 + font);
    cairo_show_text(cr, label.c_str());
  }
  for (double t : y_ticks) {
    const std::string label = format_tick(t, y_step);
    cairo_move_to(cr, left - 5, std::round(py(t)) + 0.5);
    cairo_line_to(cr, left, std::round(py(t)) + 0.5);
    cairo_stroke(cr);
    cairo_move_to(cr, left - 8 - text_width(cr, label), py(t) + font / 3);
    cairo_show_text(cr, label.c_str());
  }
  cairo_rectangle(cr, left + 0.5, top + 0.5, right - left - 1, bottom - top - 1);
  cairo_stroke(cr);

  // Title and axis labels.
  if (!spec.title.empty()) {
    // A title wider than the image is set smaller until it fits (it was clipped at both sides).
    cairo_set_font_size(cr, font * 1.2);
    const double title_room = width - 20.0, title_width = text_width(cr, spec.title);
    if (title_width > title_room) cairo_set_font_size(cr, font * 1.2 * title_room / title_width);
    const double title_x = std::max(10.0, (left + right) / 2 - text_width(cr, spec.title) / 2);
    cairo_move_to(cr, std::min(title_x, width - 10.0 - text_width(cr, spec.title)), 1.6 * font);
    cairo_show_text(cr, spec.title.c_str());
    cairo_set_font_size(cr, font);
  }
  if (!spec.x_label.empty()) {
    cairo_move_to(cr, (left + right) / 2 - text_width(cr, spec.x_label) / 2, height - 0.8 * font);
    cairo_show_text(cr, spec.x_label.c_str());
  }
  if (!spec.y_label.empty()) {
    cairo_save(cr);
    cairo_move_to(cr, 1.3 * font, (top + bottom) / 2 + text_width(cr, spec.y_label) / 2);
    cairo_rotate(cr, -kPi / 2);
    cairo_show_text(cr, spec.y_label.c_str());
    cairo_restore(cr);
  }

  // Series, clipped to the plot area widened by a marker (a given y range may cut them; a marker
  // on the edge of the range stays whole).
  const double marker = std::clamp(width / 250.0, 2.5, 5.0);
  cairo_save(cr);
  cairo_rectangle(cr, left - 2 * marker, top - 2 * marker, right - left + 4 * marker,
                  bottom - top + 4 * marker);
  cairo_clip(cr);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  for (std::size_t k = 0; k < spec.series.size(); ++k) {
    const Series& s = spec.series[k];
    const Rgb c = kPalette[k % kPalette.size()];
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_set_line_width(cr, 2);
    bool pen_down = false;
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.y[i])) {
        pen_down = false;
        continue;
      }
      if (pen_down)
        cairo_line_to(cr, px(s.x[i]), py(s.y[i]));
      else
        cairo_move_to(cr, px(s.x[i]), py(s.y[i]));
      pen_down = true;
    }
    cairo_stroke(cr);
    // Markers: past the 10 colours, the marker differs between series of the same colour.
    const int kind = static_cast<int>(k % kMarkers + k / kPalette.size());
    for (std::size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.y[i])) draw_marker(cr, kind, px(s.x[i]), py(s.y[i]), marker);
  }
  cairo_restore(cr);

  // Legend: upper right corner of the plot area, one line per series with its line and marker.
  double legend_text = 0;
  for (const Series& s : spec.series) legend_text = std::max(legend_text, text_width(cr, s.label));
  const double line_h = 1.4 * font;
  const double box_w = legend_text + 48, box_h = line_h * spec.series.size() + 8;
  const double bx = right - box_w - 8, by = top + 8;
  cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
  cairo_rectangle(cr, bx, by, box_w, box_h);
  cairo_fill_preserve(cr);
  cairo_set_source_rgb(cr, 0.6, 0.6, 0.6);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  for (std::size_t k = 0; k < spec.series.size(); ++k) {
    const Rgb c = kPalette[k % kPalette.size()];
    const double y = by + 4 + line_h * (k + 0.5);
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_set_line_width(cr, 2);
    cairo_move_to(cr, bx + 6, y);
    cairo_line_to(cr, bx + 34, y);
    cairo_stroke(cr);
    draw_marker(cr, static_cast<int>(k % kMarkers + k / kPalette.size()), bx + 20, y, marker);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_move_to(cr, bx + 40, y + font / 3);
    cairo_show_text(cr, spec.series[k].label.c_str());
  }

  cairo_surface_flush(surface.get());
  // Encoded in memory (a plot is tens of KiB), then written atomically (files.h): a run killed
  // while plotting leaves the previous plot or none, never a truncated PNG.
  std::string png;
  const cairo_status_t status = cairo_surface_write_to_png_stream(
      surface.get(),
      [](void* closure, const unsigned char* data, unsigned int length) {
        try {  // no exception may cross cairo's C code
          static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
          return CAIRO_STATUS_SUCCESS;
        } catch (...) {
          return CAIRO_STATUS_NO_MEMORY;
        }
      },
      &png);
  if (status != CAIRO_STATUS_SUCCESS)
    fail(kOp, "path", "a plot cairo can encode as PNG",
         "'" + path + "' (" + cairo_status_to_string(status) + ")");
  write_file_atomically(path, png, kOp);
}

}  // namespace phasor::tasks
