// bench_plot.cpp: the two-panel bench chart: a pixel canvas, a 5x7 bitmap font, the panels.
#include "cli/bench_plot.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cli/png_writer.h"

namespace lily::cli {
namespace {

struct Rgb {
  uint8_t r, g, b;
};
constexpr Rgb kWhite{255, 255, 255}, kInk{20, 20, 20}, kAxis{0, 0, 0}, kGrid{228, 228, 228}, kNote{100, 100, 100},
    kPrefill{31, 90, 200}, kDecode{205, 60, 20};

// 5x7 glyphs (row 7 holds descenders), one byte per row, bit 4 = leftmost column.
struct Glyph {
  char c;
  uint8_t rows[8];
};
constexpr Glyph kFont[] = {
    {'0', {14, 17, 19, 21, 25, 17, 14}},   {'1', {4, 12, 4, 4, 4, 4, 14}},      {'2', {14, 17, 1, 2, 4, 8, 31}},
    {'3', {14, 17, 1, 6, 1, 17, 14}},      {'4', {2, 6, 10, 18, 31, 2, 2}},     {'5', {31, 16, 30, 1, 1, 17, 14}},
    {'6', {6, 8, 16, 30, 17, 17, 14}},     {'7', {31, 1, 2, 4, 8, 8, 8}},       {'8', {14, 17, 17, 14, 17, 17, 14}},
    {'9', {14, 17, 17, 15, 1, 2, 12}},     {'A', {14, 17, 17, 31, 17, 17, 17}}, {'B', {30, 17, 17, 30, 17, 17, 30}},
    {'C', {14, 17, 16, 16, 16, 17, 14}},   {'D', {30, 17, 17, 17, 17, 17, 30}}, {'E', {31, 16, 16, 30, 16, 16, 31}},
    {'F', {31, 16, 16, 30, 16, 16, 16}},   {'G', {14, 17, 16, 23, 17, 17, 15}}, {'H', {17, 17, 17, 31, 17, 17, 17}},
    {'I', {14, 4, 4, 4, 4, 4, 14}},        {'J', {7, 2, 2, 2, 2, 18, 12}},      {'K', {17, 18, 20, 24, 20, 18, 17}},
    {'L', {16, 16, 16, 16, 16, 16, 31}},   {'M', {17, 27, 21, 21, 17, 17, 17}}, {'N', {17, 17, 25, 21, 19, 17, 17}},
    {'O', {14, 17, 17, 17, 17, 17, 14}},   {'P', {30, 17, 17, 30, 16, 16, 16}}, {'Q', {14, 17, 17, 17, 21, 18, 13}},
    {'R', {30, 17, 17, 30, 20, 18, 17}},   {'S', {15, 16, 16, 14, 1, 1, 30}},   {'T', {31, 4, 4, 4, 4, 4, 4}},
    {'U', {17, 17, 17, 17, 17, 17, 14}},   {'V', {17, 17, 17, 17, 17, 10, 4}},  {'W', {17, 17, 17, 21, 21, 21, 10}},
    {'X', {17, 17, 10, 4, 10, 17, 17}},    {'Y', {17, 17, 10, 4, 4, 4, 4}},     {'Z', {31, 1, 2, 4, 8, 16, 31}},
    {'a', {0, 0, 14, 1, 15, 17, 15}},      {'b', {16, 16, 22, 25, 17, 17, 30}}, {'c', {0, 0, 14, 16, 16, 17, 14}},
    {'d', {1, 1, 13, 19, 17, 17, 15}},     {'e', {0, 0, 14, 17, 31, 16, 14}},   {'f', {6, 9, 8, 28, 8, 8, 8}},
    {'g', {0, 0, 15, 17, 17, 15, 1, 14}},  {'h', {16, 16, 22, 25, 17, 17, 17}}, {'i', {4, 0, 12, 4, 4, 4, 14}},
    {'j', {2, 0, 6, 2, 2, 2, 18, 12}},     {'k', {16, 16, 18, 20, 24, 20, 18}}, {'l', {12, 4, 4, 4, 4, 4, 14}},
    {'m', {0, 0, 26, 21, 21, 17, 17}},     {'n', {0, 0, 22, 25, 17, 17, 17}},   {'o', {0, 0, 14, 17, 17, 17, 14}},
    {'p', {0, 0, 30, 17, 17, 30, 16, 16}}, {'q', {0, 0, 15, 17, 17, 15, 1, 1}}, {'r', {0, 0, 22, 25, 16, 16, 16}},
    {'s', {0, 0, 15, 16, 14, 1, 30}},      {'t', {8, 8, 28, 8, 8, 9, 6}},       {'u', {0, 0, 17, 17, 17, 19, 13}},
    {'v', {0, 0, 17, 17, 17, 10, 4}},      {'w', {0, 0, 17, 17, 21, 21, 10}},   {'x', {0, 0, 17, 10, 4, 10, 17}},
    {'y', {0, 0, 17, 17, 17, 15, 1, 14}},  {'z', {0, 0, 31, 2, 4, 8, 31}},      {' ', {0}},
    {'.', {0, 0, 0, 0, 0, 12, 12}},        {',', {0, 0, 0, 0, 12, 4, 8}},       {':', {0, 12, 12, 0, 12, 12, 0}},
    {';', {0, 12, 12, 0, 12, 4, 8}},       {'-', {0, 0, 0, 31, 0, 0, 0}},       {'_', {0, 0, 0, 0, 0, 0, 31}},
    {'/', {1, 1, 2, 4, 8, 16, 16}},        {'%', {24, 25, 2, 4, 8, 19, 3}},     {'(', {2, 4, 8, 8, 8, 4, 2}},
    {')', {8, 4, 2, 2, 2, 4, 8}},          {'[', {14, 8, 8, 8, 8, 8, 14}},      {']', {14, 2, 2, 2, 2, 2, 14}},
    {'+', {0, 4, 4, 31, 4, 4, 0}},         {'=', {0, 0, 31, 0, 31, 0, 0}},      {'\'', {4, 4, 8, 0, 0, 0, 0}},
    {'!', {4, 4, 4, 4, 4, 0, 4}},          {'?', {14, 17, 1, 2, 4, 0, 4}},      {'*', {0, 4, 21, 14, 21, 4, 0}},
    {'<', {2, 4, 8, 16, 8, 4, 2}},         {'>', {8, 4, 2, 1, 2, 4, 8}},        {'#', {10, 10, 31, 10, 31, 10, 10}},
};

const Glyph& glyph(char c) {
  for (const Glyph& g : kFont)
    if (g.c == c) return g;
  return glyph('?');
}

struct Canvas {
  RgbImage img;

  Canvas(int w, int h) { img = {w, h, std::vector<uint8_t>(size_t(w) * size_t(h) * 3, 255)}; }
  void set(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= img.width || y >= img.height) return;
    uint8_t* p = &img.rgb[(size_t(y) * size_t(img.width) + size_t(x)) * 3];
    p[0] = c.r, p[1] = c.g, p[2] = c.b;
  }
  void fill(int x0, int y0, int x1, int y1, Rgb c) {  // inclusive corners
    for (int y = y0; y <= y1; ++y)
      for (int x = x0; x <= x1; ++x) set(x, y, c);
  }
  void line(int x0, int y0, int x1, int y1, Rgb c, int width) {  // Bresenham, `width` rows thick
    int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0), sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    for (int err = dx + dy;;) {
      for (int k = 0; k < width; ++k) set(x0, y0 + k - width / 2, c);
      if (x0 == x1 && y0 == y1) break;
      int e2 = 2 * err;
      if (e2 >= dy) err += dy, x0 += sx;
      if (e2 <= dx) err += dx, y0 += sy;
    }
  }
  void disk(int cx, int cy, int r, Rgb c) {
    for (int y = -r; y <= r; ++y)
      for (int x = -r; x <= r; ++x)
        if (x * x + y * y <= r * r + r) set(cx + x, cy + y, c);
  }
  static int text_width(const std::string& s, int scale) { return int(s.size()) * 6 * scale - scale; }
  void text(int x, int y, const std::string& s, int scale, Rgb c) {  // (x, y): top left of the cell
    for (char ch : s) {
      const Glyph& g = glyph(ch);
      for (int row = 0; row < 8; ++row)
        for (int col = 0; col < 5; ++col)
          if (g.rows[row] & (16 >> col))
            fill(x + col * scale, y + row * scale, x + col * scale + scale - 1, y + row * scale + scale - 1, c);
      x += 6 * scale;
    }
  }
};

// "256", "4K", "128K", "1M": lengths on the x axis.
std::string length_label(int64_t n) {
  if (n >= (1 << 20) && n % (1 << 20) == 0) return fmt::format("{}M", n >> 20);
  if (n >= 1024 && n % 1024 == 0) return fmt::format("{}K", n >> 10);
  return fmt::format("{}", n);
}

// Tokens/s on the y axis: "0", "2.5", "750", "12.5K", "1.2M".
std::string rate_label(double v) {
  if (v >= 1e6) return fmt::format("{:g}M", v / 1e6);
  if (v >= 1e4) return fmt::format("{:g}K", v / 1e3);
  return fmt::format("{:g}", std::round(v * 1e4) / 1e4);
}

// The y range: 0 up to the least round value {1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10} x 10^k at or
// above `max`, with the number of steps that makes each step round too.
void y_range(double max, double& top, int& steps) {
  constexpr struct {
    double f;
    int steps;
  } kTops[] = {{1, 5}, {1.5, 3}, {2, 4}, {2.5, 5}, {3, 6}, {4, 4}, {5, 5}, {6, 6}, {8, 4}, {10, 5}};
  double p = std::pow(10.0, std::floor(std::log10(max)));
  for (auto t : kTops)
    if (t.f * p >= max * (1 - 1e-12)) {
      top = t.f * p;
      steps = t.steps;
      return;
    }
}

std::string fit(const std::string& s, int width, int scale) {
  if (Canvas::text_width(s, scale) <= width) return s;
  size_t keep = size_t(std::max(0, (width + scale) / (6 * scale) - 3));
  return s.substr(0, keep) + "...";
}

void draw_panel(Canvas& cv, int panel, const std::vector<BenchPoint>& all, const char* kind, const std::string& title,
                const std::string& x_name, Rgb colour) {
  const PlotRect r = bench_panel_rect(panel);
  std::vector<BenchPoint> pts;
  for (const BenchPoint& p : all)
    if (p.kind == kind && p.length > 0 && std::isfinite(p.tokens_per_second) && p.tokens_per_second > 0)
      pts.push_back(p);
  size_t skipped = size_t(std::count_if(all.begin(), all.end(), [&](const BenchPoint& p) { return p.kind == kind; })) -
                   pts.size();
  std::sort(pts.begin(), pts.end(), [](const BenchPoint& a, const BenchPoint& b) { return a.length < b.length; });

  cv.text((r.left + r.right - Canvas::text_width(title, 2)) / 2, r.top - 42, title, 2, kInk);
  cv.text(r.left - 40, r.top - 16, "tokens/s", 1, kInk);
  cv.text((r.left + r.right - Canvas::text_width(x_name, 1)) / 2, r.bottom + 24, x_name, 1, kInk);
  if (skipped > 0) {
    std::string note = fmt::format("{} point{} left out (length or tokens/s not positive)", skipped,
                                   skipped == 1 ? "" : "s");
    cv.text(r.left, r.bottom + 38, fit(note, r.right - r.left, 1), 1, kNote);
  }

  double y_top = 1;
  int y_steps = 5;
  if (!pts.empty()) {
    double m = 0;
    for (const BenchPoint& p : pts) m = std::max(m, p.tokens_per_second);
    y_range(m, y_top, y_steps);
  }
  int lo = 8, hi = 12;  // an empty panel still shows an axis
  if (!pts.empty()) {
    lo = int(std::floor(std::log2(double(pts.front().length))));
    hi = int(std::ceil(std::log2(double(pts.back().length))));
    if (lo == hi) lo -= 1, hi += 1;
  }
  auto px = [&](double length) {
    return r.left + int(std::lround((std::log2(length) - lo) / (hi - lo) * (r.right - r.left)));
  };
  auto py = [&](double v) { return r.bottom - int(std::lround(v / y_top * (r.bottom - r.top))); };

  // Grid and y ticks, then the axes on top.
  for (int i = 0; i <= y_steps; ++i) {
    double v = y_top * i / y_steps;
    int y = py(v);
    if (i > 0) cv.fill(r.left + 1, y, r.right, y, kGrid);
    cv.fill(r.left - 5, y, r.left - 1, y, kAxis);
    std::string s = rate_label(v);
    cv.text(r.left - 8 - Canvas::text_width(s, 1), y - 3, s, 1, kInk);
  }
  const int x_every = std::max(1, int(std::ceil(40.0 * (hi - lo) / (r.right - r.left))));  // room for "128K"
  for (int k = lo; k <= hi; ++k) {
    int x = px(std::ldexp(1.0, k));
    cv.fill(x, r.bottom + 1, x, r.bottom + 5, kAxis);
    if ((k - lo) % x_every != 0) continue;
    std::string s = k >= 0 ? length_label(int64_t(1) << k) : "";
    cv.text(x - Canvas::text_width(s, 1) / 2, r.bottom + 9, s, 1, kInk);
  }
  cv.fill(r.left, r.top, r.left, r.bottom, kAxis);
  cv.fill(r.left, r.bottom, r.right, r.bottom, kAxis);

  if (pts.empty()) {
    cv.text((r.left + r.right - Canvas::text_width("no data", 2)) / 2, (r.top + r.bottom) / 2 - 8, "no data", 2, kNote);
    return;
  }
  for (size_t i = 1; i < pts.size(); ++i)
    cv.line(px(double(pts[i - 1].length)), py(pts[i - 1].tokens_per_second), px(double(pts[i].length)),
            py(pts[i].tokens_per_second), colour, 2);
  // Percent labels, centred above the point, or below it where the point is lower than the
  // mean of its neighbours (a dip, where the line passes above); skipped where they would overlap.
  int label_end = -1000;
  for (size_t i = 0; i < pts.size(); ++i) {
    const BenchPoint& p = pts[i];
    int x = px(double(p.length)), y = py(p.tokens_per_second);
    cv.disk(x, y, 4, colour);
    if (!(p.percent_of_peak > 0) || !std::isfinite(p.percent_of_peak)) continue;
    std::string s = p.percent_of_peak >= 10    ? fmt::format("{:.0f}%", p.percent_of_peak)
                    : p.percent_of_peak >= 0.1 ? fmt::format("{:.1f}%", p.percent_of_peak)
                                               : std::string("<0.1%");
    double prev = pts[i > 0 ? i - 1 : i].tokens_per_second,
           next = pts[i + 1 < pts.size() ? i + 1 : i].tokens_per_second;
    bool below = (p.tokens_per_second < (prev + next) / 2 || y < r.top + 16) && y + 16 < r.bottom;
    int w = Canvas::text_width(s, 1);
    int lx = std::clamp(x - w / 2, r.left + 2, r.right - w), ly = below ? y + 8 : y - 15;
    if (lx <= label_end + 3) continue;
    cv.text(lx, ly, s, 1, kNote);
    label_end = lx + w;
  }
}

}  // namespace

PlotRect bench_panel_rect(int panel) {
  const int x0 = panel * (kBenchPlotWidth / 2);
  return {x0 + 75, 95, x0 + 470, 480};
}

RgbImage render_bench_plot(const std::vector<BenchPoint>& points, const std::string& title) {
  Canvas cv(kBenchPlotWidth, kBenchPlotHeight);
  // The headline at double size if it fits, else at single size, truncated if it still does not.
  const std::string head = "lily bench: " + title;
  const int head_scale = Canvas::text_width(head, 2) <= kBenchPlotWidth - 24 ? 2 : 1;
  cv.text(12, head_scale == 2 ? 12 : 18, fit(head, kBenchPlotWidth - 24, head_scale), head_scale, kInk);
  draw_panel(cv, 0, points, "prefill", "prefill tokens/s vs prompt length", "prompt length (tokens, log2 scale)",
             kPrefill);
  draw_panel(cv, 1, points, "decode", "decode tokens/s vs context depth", "context depth (tokens, log2 scale)",
             kDecode);
  cv.text(12, kBenchPlotHeight - 18, "labels: % of peak (prefill: bf16 matrix peak, decode: measured copy bandwidth)",
          1, kNote);
  return std::move(cv.img);
}

void write_bench_plot(const std::string& path, const std::vector<BenchPoint>& points, const std::string& title) {
  RgbImage img = render_bench_plot(points, title);
  write_png_rgb(path, img.width, img.height, img.rgb);
}

}  // namespace lily::cli
