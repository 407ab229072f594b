// phasor::tasks line plots: the PNG file (signature, size, read back with cairo), where a series'
// colour lands, the tick choice, and the errors.
#include <gtest/gtest.h>

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "phasor/common.h"
#include "phasor/tasks/plot.h"

namespace phasor::tasks {
namespace {

namespace fs = std::filesystem;

fs::path temp_png(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / "phasor_tasks_plot_test";
  fs::create_directories(dir);
  return dir / name;
}

// The PNG read back with cairo: width, height and the pixels (0xRRGGBB, alpha ignored).
struct Image {
  int width = 0, height = 0;
  std::vector<std::uint32_t> pixels;
  std::uint32_t at(int x, int y) const {
    return pixels[static_cast<std::size_t>(y) * width + x] & 0xFFFFFFu;
  }
};

Image read_png(const fs::path& path) {
  cairo_surface_t* s = cairo_image_surface_create_from_png(path.c_str());
  EXPECT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << path;
  Image img;
  img.width = cairo_image_surface_get_width(s);
  img.height = cairo_image_surface_get_height(s);
  const int stride = cairo_image_surface_get_stride(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  for (int y = 0; y < img.height && data; ++y)
    for (int x = 0; x < img.width; ++x)
      img.pixels.push_back(*reinterpret_cast<const std::uint32_t*>(data + y * stride + 4 * x));
  cairo_surface_destroy(s);
  return img;
}

// tab10's first three colours, the colours of series 0, 1, 2.
constexpr std::uint32_t kBlue = 0x1F77B4, kOrange = 0xFF7F0E, kGreen = 0x2CA02C;

// Pixels of exactly this colour (the inside of lines and markers is drawn unblended).
struct ColourStats {
  int count = 0;
  int min_x = std::numeric_limits<int>::max(), max_x = -1;
  std::vector<int> ys;
  int median_y() {
    std::sort(ys.begin(), ys.end());
    return ys.empty() ? -1 : ys[ys.size() / 2];
  }
};
ColourStats find_colour(const Image& img, std::uint32_t colour) {
  ColourStats st;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x)
      if (img.at(x, y) == colour) {
        ++st.count;
        st.min_x = std::min(st.min_x, x);
        st.max_x = std::max(st.max_x, x);
        st.ys.push_back(y);
      }
  return st;
}

TEST(TasksPlot, WritesPngOfRequestedSize) {
  PlotSpec spec;
  spec.title = "accuracy vs length";
  spec.x_label = "evaluation length";
  spec.y_label = "sequence accuracy";
  spec.series.push_back({"gla", {64, 128, 256, 512}, {1.0, 0.9, 0.5, 0.1}});
  spec.log_x = true;
  spec.x_ticks = {64, 128, 256, 512};
  const fs::path path = temp_png("size.png");
  write_line_plot_png(spec, path.string(), 640, 360);

  std::ifstream in(path, std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  const unsigned char png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  EXPECT_EQ(std::memcmp(sig, png, 8), 0) << "not a PNG signature";
  const Image img = read_png(path);
  EXPECT_EQ(img.width, 640);
  EXPECT_EQ(img.height, 360);
  // Mostly white background, some black (axes, text).
  int white = 0, black = 0;
  for (auto p : img.pixels) {
    white += (p & 0xFFFFFF) == 0xFFFFFF;
    black += (p & 0xFFFFFF) == 0;
  }
  EXPECT_GT(white, img.width * img.height / 2);
  EXPECT_GT(black, 300);
}

// Two flat series at y = 0.8 and y = 0.2 on a fixed [0, 1] range, plus a rising one: each colour
// appears, spans the plot horizontally, and sits at the right height (0.8 above 0.2, the plot
// area between them); the legend adds only a few pixels of each colour.
TEST(TasksPlot, SeriesColoursWhereExpected) {
  PlotSpec spec;
  spec.title = "t";
  spec.x_label = "x";
  spec.y_label = "y";
  spec.y_range = std::make_pair(0.0, 1.0);
  spec.series.push_back({"high", {0, 1, 2, 3, 4}, {0.8, 0.8, 0.8, 0.8, 0.8}});
  spec.series.push_back({"low", {0, 1, 2, 3, 4}, {0.2, 0.2, 0.2, 0.2, 0.2}});
  spec.series.push_back({"rising", {0, 4}, {0.3, 0.7}});
  const fs::path path = temp_png("colours.png");
  const int W = 800, H = 500;
  write_line_plot_png(spec, path.string(), W, H);
  const Image img = read_png(path);
  ColourStats high = find_colour(img, kBlue), low = find_colour(img, kOrange),
              rising = find_colour(img, kGreen);
  for (auto* st : {&high, &low, &rising}) {
    EXPECT_GT(st->count, 500);
    EXPECT_LT(st->min_x, W / 5);      // starts near the left of the plot area
    EXPECT_GT(st->max_x, 4 * W / 5);  // and ends near the right
  }
  const int yh = high.median_y(), yl = low.median_y(), yr = rising.median_y();
  // The plot area spans roughly [0.05 H, 0.9 H]; y = 0.8 lies in its upper third, 0.2 in its lower.
  EXPECT_LT(yh, H * 0.4);
  EXPECT_GT(yl, H * 0.6);
  EXPECT_GT(yr, yh);
  EXPECT_LT(yr, yl);
  // 0.8 and 0.2 are symmetric about 0.5: the middle of the two rows is the middle of the axis,
  // where the rising line (0.3 → 0.7) crosses.
  EXPECT_NEAR((yh + yl) / 2.0, yr, H * 0.03);
}

// NaN points are skipped (a break in the line), the rest is drawn; one-point series and series
// beyond the palette work.
TEST(TasksPlot, NanPointsAndManySeries) {
  PlotSpec spec;
  spec.series.push_back({"with a gap", {1, 2, 3, 4}, {0.1, std::nan(""), 0.3, 0.4}});
  spec.series.push_back({"single", {2.5}, {0.2}});
  for (int k = 2; k < 13; ++k)
    spec.series.push_back({"s" + std::to_string(k), {1, 4}, {0.05 * k, 0.05 * k + 0.1}});
  const fs::path path = temp_png("nan.png");
  write_line_plot_png(spec, path.string(), 400, 300);
  const Image img = read_png(path);
  EXPECT_EQ(img.width, 400);
  EXPECT_GT(find_colour(img, kBlue).count, 50);
  EXPECT_GT(find_colour(img, kOrange).count, 10);  // the single point's marker (+ legend)

  // All-NaN series: an empty frame, no error.
  PlotSpec empty;
  empty.series.push_back({"nan", {1, 2}, {std::nan(""), std::nan("")}});
  EXPECT_NO_THROW(write_line_plot_png(empty, temp_png("allnan.png").string()));
}

TEST(TasksPlot, NiceTicks) {
  EXPECT_EQ(nice_ticks(0, 1, 7), (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0}));
  EXPECT_EQ(nice_ticks(0, 100, 6), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  EXPECT_EQ(nice_ticks(-3, 7, 3), (std::vector<double>{0, 5}));
  EXPECT_EQ(nice_ticks(2.05, 2.35, 4), (std::vector<double>{2.1, 2.2, 2.3}));
  for (double lo : {-7.3, 0.0, 1e-6, 123.0})
    for (double span : {1e-3, 0.7, 13.0, 5e4})
      for (int n : {2, 5, 8}) {
        const auto t = nice_ticks(lo, lo + span, n);
        ASSERT_GE(t.size(), 1u);
        EXPECT_LE(static_cast<int>(t.size()), n);
        EXPECT_GE(t.front(), lo - 1e-9 * span);
        EXPECT_LE(t.back(), lo + span + 1e-9 * span);
      }
  // Log axis: 1-2-5 values when few, else powers of ten, thinned when too many.
  EXPECT_EQ(log_ticks(64, 1024, 8), (std::vector<double>{100, 200, 500, 1000}));
  EXPECT_EQ(log_ticks(1, 1e4, 6), (std::vector<double>{1, 10, 100, 1000, 1e4}));
  EXPECT_LE(log_ticks(1e-30, 1e30, 8).size(), 8u);
  EXPECT_EQ(log_ticks(3, 4, 8), (std::vector<double>{3, 4}));  // no 1-2-5 value inside: ends
}

TEST(TasksPlot, TickLabels) {
  EXPECT_EQ(format_tick(100, 100), "100");
  EXPECT_EQ(format_tick(800, 100), "800");
  EXPECT_EQ(format_tick(0.6000000000000001, 0.2), "0.6");
  EXPECT_EQ(format_tick(0.15, 0.05), "0.15");
  EXPECT_EQ(format_tick(-1e-17, 0.2), "0.0");
  EXPECT_EQ(format_tick(3, 1), "3");
  EXPECT_EQ(format_tick(2e6, 1e6), "2e+06");
  EXPECT_EQ(format_tick(5e-5, 1e-5), "5e-05");
  EXPECT_EQ(format_tick(200, 1), "200");  // log axis: integer ticks
}

std::string error_of(const PlotSpec& spec, const std::string& path, int w = 800, int h = 500) {
  try {
    write_line_plot_png(spec, path, w, h);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(TasksPlot, Errors) {
  const std::string ok_path = temp_png("err.png").string();
  PlotSpec none;
  EXPECT_NE(error_of(none, ok_path).find("argument 'spec.series': expected at least one series"),
            std::string::npos);

  PlotSpec empty;
  empty.series.push_back({"a", {1}, {1}});
  empty.series.push_back({"b", {}, {}});
  const std::string e1 = error_of(empty, ok_path);
  EXPECT_NE(e1.find("write_line_plot_png: argument 'spec.series[1] ('b')'"), std::string::npos)
      << e1;
  EXPECT_NE(e1.find("an empty series"), std::string::npos) << e1;

  PlotSpec mismatch;
  mismatch.series.push_back({"m", {1, 2, 3}, {1, 2}});
  EXPECT_NE(error_of(mismatch, ok_path).find("expected as many y as x values, got 3 x and 2 y"),
            std::string::npos);

  PlotSpec logx;
  logx.log_x = true;
  logx.series.push_back({"l", {0, 1}, {1, 2}});
  EXPECT_NE(error_of(logx, ok_path).find("positive values (log_x), got 0"), std::string::npos);

  PlotSpec inf_x;
  inf_x.series.push_back({"i", {1, INFINITY}, {1, 2}});
  EXPECT_NE(error_of(inf_x, ok_path).find("'spec.series[0] ('i').x': expected finite values"),
            std::string::npos);

  PlotSpec ticks;
  ticks.series.push_back({"t", {1, 2}, {1, 2}});
  ticks.x_ticks = {1, NAN};
  EXPECT_NE(error_of(ticks, ok_path).find("argument 'spec.x_ticks': expected finite values"),
            std::string::npos);

  PlotSpec range;
  range.series.push_back({"r", {1, 2}, {1, 2}});
  range.y_range = std::make_pair(1.0, 1.0);
  EXPECT_NE(error_of(range, ok_path).find("'spec.y_range': expected finite lo < hi"),
            std::string::npos);

  range.y_range.reset();
  EXPECT_NE(error_of(range, ok_path, 100, 500).find("argument 'width'"), std::string::npos);
  EXPECT_NE(error_of(range, ok_path, 800, 10).find("argument 'height'"), std::string::npos);

  const std::string bad = (fs::temp_directory_path() / "no_such_dir_phasor" / "x.png").string();
  const std::string e2 = error_of(range, bad);
  EXPECT_NE(e2.find("argument 'path': expected a writable file path, got '" + bad + "'"),
            std::string::npos)
      << e2;
  EXPECT_FALSE(fs::exists(bad));
}

}  // namespace
}  // namespace phasor::tasks
