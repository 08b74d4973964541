// bench_plot.h: `lily bench --plot FILE.png` draws the sweep as a PNG with two panels,
// "prefill tokens/s vs prompt length" and "decode tokens/s vs context depth".
//
// Axes: x is log2 of the length (ticks at powers of two, labelled 256, 4K, 128K), y is linear
// from 0 to the least of {1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} x 10^k at or above the largest
// tokens/s. Each point is a dot on a polyline,
// labelled with its percent of peak where that is positive and the label has room.
//
// Invalid input never throws: rows of an unknown kind, with length <= 0, or with tokens/s that
// is not a finite positive number are left out, and the panel says how many were; a panel with
// no points left says "no data". Lengths that are not powers of two are drawn at their log2
// position. Only failing to write the file throws (lily::Error naming the path).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lily::cli {

// One measured point; the plotter's only input besides the title.
struct BenchPoint {
  std::string kind;  // "prefill" or "decode"
  int64_t length;    // prompt length (prefill) or context depth (decode), tokens
  double tokens_per_second;
  double percent_of_peak;  // <= 0: no label
};

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3] uint8
};

constexpr int kBenchPlotWidth = 1000;
constexpr int kBenchPlotHeight = 560;

// The plot area of a panel (0: prefill, 1: decode), in pixels, edges inclusive. The x axis is
// drawn on row `bottom`, the y axis on column `left`; the smallest tick of x sits on `left`,
// the largest on `right`, y = 0 on `bottom` and the top of the y range on `top`.
struct PlotRect {
  int left, top, right, bottom;
};
PlotRect bench_panel_rect(int panel);

RgbImage render_bench_plot(const std::vector<BenchPoint>& points, const std::string& title);

void write_bench_plot(const std::string& path, const std::vector<BenchPoint>& points, const std::string& title);

}  // namespace lily::cli
