// phasor::tasks — line plots as PNG files (cairo; no LibTorch), for the experiment runner's
// accuracy-vs-length and loss curves.
//
// A plot has axes with numeric tick labels at "nice" values (1, 2, 5 × 10^k steps), a light grid,
// one polyline per series in a distinct colour (the 10 colours of matplotlib's "tab10", then
// repeated with another marker), a marker at every point (circle, square, triangle, diamond, …
// cycling with the series), and a legend in the upper right corner of the plot area. Points with
// a non-finite y (NaN: e.g. an accuracy with nothing scored) are skipped and break the line.
//
// Errors throw phasor::Error "write_line_plot_png: argument '<name>': expected …, got …".
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace phasor::tasks {

struct Series {
  std::string label;
  std::vector<double> x, y;  // same length ≥ 1; x finite (and > 0 with log_x)
};

struct PlotSpec {
  std::string title;
  std::string x_label;
  std::string y_label;
  std::vector<Series> series;  // at least one
  // The y range shown, (lo, hi) with lo < hi; by default the data's range, padded by 5 %.
  std::optional<std::pair<double, double>> y_range;
  bool log_x = false;  // logarithmic x axis (e.g. sequence lengths 64 … 4096)
  // Tick positions on the x axis (finite, > 0 with log_x); empty: chosen automatically. E.g. the
  // evaluation lengths 64, 128, …, which 1-2-5 ticks would miss.
  std::vector<double> x_ticks;
};

// Draws the plot into a width × height RGB PNG at `path`, replacing it atomically (files.h).
// width ≥ 200, height ≥ 150.
void write_line_plot_png(const PlotSpec& spec, const std::string& path, int width = 800,
                         int height = 500);

// Tick positions covering [lo, hi] (lo < hi, finite): the multiples of a step 1, 2 or 5 × 10^k
// inside [lo, hi], the step chosen as the smallest such that there are at most `max_ticks` ticks
// (max_ticks ≥ 2). Exposed for the tests.
std::vector<double> nice_ticks(double lo, double hi, int max_ticks);
// Tick positions of a logarithmic axis over [lo, hi] (0 < lo < hi): the values 1, 2, 5 × 10^k
// inside the range when they are at most max_ticks, else the powers of ten (thinned to every
// 10^m-th power when there are still too many), and always at least the two ends of the range.
std::vector<double> log_ticks(double lo, double hi, int max_ticks);

// A tick label: fixed notation with the decimals the step between ticks needs (step 0.2 → "0.4",
// 0.05 → "0.15", 100 → "300"), %.3g outside [1e−4, 1e6). Exposed for the tests.
std::string format_tick(double value, double step);

}  // namespace phasor::tasks
