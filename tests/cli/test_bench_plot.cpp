// test_bench_plot.cpp: `lily bench --plot`: the PNG encoder (decoded here by an independent
// reader: chunk CRCs, stored deflate blocks, adler32) and the chart (size, background, axes,
// markers at the expected pixel, invalid input).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>

#include "base/error.h"
#include "cli/bench_plot.h"
#include "cli/png_writer.h"

namespace lily::cli {
namespace {

// ---- tiny reference: a bitwise CRC32, a plain adler32, and a PNG reader for stored blocks ----

uint32_t crc32_bitwise(const uint8_t* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
  }
  return ~c;
}

uint32_t adler32_plain(const std::vector<uint8_t>& v) {
  uint64_t a = 1, b = 0;
  for (uint8_t x : v) a = (a + x) % 65521, b = (b + a) % 65521;
  return uint32_t(b << 16 | a);
}

uint32_t be32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

struct Decoded {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;
  std::vector<std::string> chunk_types;
  size_t stored_blocks = 0;
};

// Fails the test (ADD_FAILURE) and returns what it has on any malformation.
Decoded decode_png(const std::vector<uint8_t>& f) {
  Decoded d;
  const uint8_t sig[8] = {0x89, 'P', 'N', 'G', 13, 10, 26, 10};
  if (f.size() < 8 || !std::equal(sig, sig + 8, f.begin())) {
    ADD_FAILURE() << "bad signature";
    return d;
  }
  std::vector<uint8_t> idat;
  size_t pos = 8;
  while (pos + 12 <= f.size()) {
    uint32_t len = be32(&f[pos]);
    if (pos + 12 + len > f.size()) {
      ADD_FAILURE() << "chunk runs past the end";
      return d;
    }
    std::string type(f.begin() + long(pos) + 4, f.begin() + long(pos) + 8);
    const uint8_t* data = &f[pos + 8];
    EXPECT_EQ(be32(data + len), crc32_bitwise(&f[pos + 4], len + 4)) << "CRC of chunk " << type;
    d.chunk_types.push_back(type);
    if (type == "IHDR") {
      EXPECT_EQ(len, 13u);
      d.width = int(be32(data));
      d.height = int(be32(data + 4));
      EXPECT_EQ(data[8], 8) << "bit depth";
      EXPECT_EQ(data[9], 2) << "colour type RGB";
      EXPECT_EQ(data[10] | data[11] | data[12], 0) << "compression, filter, interlace";
    } else if (type == "IDAT") {
      idat.insert(idat.end(), data, data + len);
    }
    pos += 12 + len;
  }
  EXPECT_EQ(pos, f.size()) << "trailing bytes";
  if (idat.size() < 6) {
    ADD_FAILURE() << "IDAT too short";
    return d;
  }
  EXPECT_EQ((idat[0] & 15), 8) << "zlib CM";
  EXPECT_EQ((idat[0] * 256 + idat[1]) % 31, 0) << "zlib FCHECK";
  std::vector<uint8_t> raw;
  size_t p = 2;
  for (bool final = false; !final;) {
    if (p + 5 > idat.size()) {
      ADD_FAILURE() << "deflate stream runs out";
      return d;
    }
    final = idat[p] & 1;
    EXPECT_EQ((idat[p] >> 1) & 3, 0) << "only stored blocks are expected";
    size_t n = idat[p + 1] | idat[p + 2] << 8, nn = idat[p + 3] | idat[p + 4] << 8;
    EXPECT_EQ(n ^ 0xffff, nn) << "NLEN";
    p += 5;
    if (p + n > idat.size()) {
      ADD_FAILURE() << "stored block runs past the stream";
      return d;
    }
    raw.insert(raw.end(), idat.begin() + long(p), idat.begin() + long(p + n));
    p += n;
    ++d.stored_blocks;
  }
  EXPECT_EQ(p + 4, idat.size()) << "adler32 should follow the last block";
  if (p + 4 <= idat.size()) {
    EXPECT_EQ(be32(&idat[p]), adler32_plain(raw));
  }
  const size_t row = size_t(d.width) * 3 + 1;
  EXPECT_EQ(raw.size(), row * size_t(d.height));
  if (raw.size() != row * size_t(d.height)) return d;
  for (int y = 0; y < d.height; ++y) {
    EXPECT_EQ(raw[size_t(y) * row], 0) << "filter type of row " << y;
    d.rgb.insert(d.rgb.end(), raw.begin() + long(size_t(y) * row + 1), raw.begin() + long(size_t(y + 1) * row));
  }
  return d;
}

struct Px {
  int r, g, b;
};
Px at(const Decoded& d, int x, int y) {
  const uint8_t* p = &d.rgb[(size_t(y) * size_t(d.width) + size_t(x)) * 3];
  return {p[0], p[1], p[2]};
}
bool is_white(Px p) { return p.r == 255 && p.g == 255 && p.b == 255; }
bool is_dark(Px p) { return p.r + p.g + p.b < 150; }
bool is_blue(Px p) { return p.b > 150 && p.r < 100; }  // the prefill series
bool is_red(Px p) { return p.r > 150 && p.b < 100; }   // the decode series

Decoded render_and_decode(const std::vector<BenchPoint>& pts, const std::string& title) {
  RgbImage img = render_bench_plot(pts, title);
  return decode_png(encode_png_rgb(img.width, img.height, img.rgb));
}

// prefill: 256 -> 100, 512 -> 250, 1024 -> 500 tokens/s: x range [2^8, 2^10], y range [0, 500].
std::vector<BenchPoint> known_points() {
  return {{"prefill", 256, 100, 12.5},
          {"prefill", 512, 250, 25},
          {"prefill", 1024, 500, 50},
          {"decode", 16, 35, 3},
          {"decode", 64, 20, 2}};
}

// ---- the encoder ----

TEST(PngWriter, CrcAndAdlerMatchTheReferenceAndKnownValues) {
  const std::string s = "123456789";
  std::vector<uint8_t> v(s.begin(), s.end());
  EXPECT_EQ(png_crc32(v), 0xCBF43926u);  // the standard CRC-32 check value
  EXPECT_EQ(zlib_adler32(v), 0x091E01DEu);
  std::vector<uint8_t> big(200000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = uint8_t(i * 7 + (i >> 9));
  EXPECT_EQ(png_crc32(big), crc32_bitwise(big.data(), big.size()));
  EXPECT_EQ(zlib_adler32(big), adler32_plain(big));
  std::vector<uint8_t> ff(100000, 0xff);  // worst case for adler32's deferred modulo
  EXPECT_EQ(zlib_adler32(ff), adler32_plain(ff));
}

TEST(PngWriter, RoundTripsOddSizesAcrossBlockBoundaries) {
  // 1x1 (one tiny block), 111x989 and 65x1009 (several 65,535-byte blocks, a partial last one).
  for (auto [w, h] : std::vector<std::pair<int, int>>{{1, 1}, {2, 3}, {111, 989}, {65, 1009}}) {
    std::vector<uint8_t> rgb(size_t(w) * size_t(h) * 3);
    for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = uint8_t(i * 31 + 7);
    Decoded d = decode_png(encode_png_rgb(w, h, rgb));
    EXPECT_EQ(d.width, w);
    EXPECT_EQ(d.height, h);
    EXPECT_EQ(d.rgb, rgb) << w << "x" << h;
    EXPECT_EQ(d.stored_blocks, (size_t(h) * (size_t(w) * 3 + 1) + 65534) / 65535);
    EXPECT_EQ(d.chunk_types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  }
}

TEST(PngWriter, RejectsMismatchedSizes) {
  std::vector<uint8_t> rgb(11);
  EXPECT_THROW(encode_png_rgb(2, 2, rgb), Error);
  EXPECT_THROW(encode_png_rgb(0, 5, {}), Error);
}

// ---- the chart ----

TEST(BenchPlot, SizeBackgroundAndAxes) {
  Decoded d = render_and_decode(known_points(), "tiny model on cpu");
  ASSERT_EQ(d.width, kBenchPlotWidth);
  ASSERT_EQ(d.height, kBenchPlotHeight);
  EXPECT_TRUE(is_white(at(d, 0, 0)));
  EXPECT_TRUE(is_white(at(d, d.width - 1, d.height - 1)));
  EXPECT_TRUE(is_white(at(d, d.width / 2, d.height / 2)));  // the gap between the panels
  for (int panel : {0, 1}) {
    PlotRect r = bench_panel_rect(panel);
    // The axes are dark except where a marker (drawn on top) covers them.
    auto axis = [](Px p) { return is_dark(p) || is_blue(p) || is_red(p); };
    for (int y = r.top; y <= r.bottom; y += 17) EXPECT_TRUE(axis(at(d, r.left, y))) << "y axis at " << y;
    for (int x = r.left; x <= r.right; x += 17) EXPECT_TRUE(axis(at(d, x, r.bottom))) << "x axis at " << x;
    EXPECT_TRUE(is_dark(at(d, r.left, r.bottom - 200)) && is_dark(at(d, r.left + 200, r.bottom)));
    EXPECT_TRUE(is_dark(at(d, r.right, r.bottom + 3))) << "the last x tick";
    EXPECT_TRUE(is_dark(at(d, r.left - 3, r.top))) << "the top y tick";
  }
  // The title is drawn: dark pixels in the top strip.
  int dark = 0;
  for (int y = 0; y < 40; ++y)
    for (int x = 0; x < d.width; ++x) dark += is_dark(at(d, x, y));
  EXPECT_GT(dark, 200);
}

TEST(BenchPlot, MarkersSitAtTheExpectedPixels) {
  Decoded d = render_and_decode(known_points(), "t");
  ASSERT_EQ(d.width, kBenchPlotWidth);
  PlotRect r = bench_panel_rect(0);
  // 512 is halfway between 2^8 and 2^10 in log2, 250 halfway up [0, 500]; 1024 -> 500 is the corner.
  int mx = (r.left + r.right) / 2, my = (r.top + r.bottom) / 2;
  for (auto [x, y] : std::vector<std::pair<int, int>>{{mx, my}, {mx + 2, my}, {mx, my - 2}, {r.right, r.top}})
    EXPECT_TRUE(is_blue(at(d, x, y))) << "prefill marker at " << x << "," << y;
  EXPECT_FALSE(is_blue(at(d, mx, r.bottom - 20))) << "no marker below the point";
  EXPECT_FALSE(is_blue(at(d, r.right - 10, (r.top + r.bottom) / 2 + 60)));
  // decode: 16 -> 35 and 64 -> 20: x range [2^4, 2^6], y range [0, 40] (35 rounds up to 40).
  PlotRect q = bench_panel_rect(1);
  int y40 = q.bottom - int(std::lround(35.0 / 40 * (q.bottom - q.top)));
  int y20 = q.bottom - int(std::lround(20.0 / 40 * (q.bottom - q.top)));
  EXPECT_TRUE(is_red(at(d, q.left + 2, y40)));
  EXPECT_TRUE(is_red(at(d, q.right, y20)));
  EXPECT_TRUE(is_red(at(d, (q.left + q.right) / 2, (y40 + y20) / 2))) << "the polyline between the two points";
  EXPECT_FALSE(is_red(at(d, q.right, y40)));
  for (int x = r.left; x <= r.right; ++x) EXPECT_FALSE(is_red(at(d, x, my))) << "decode drawn in the prefill panel";
}

TEST(BenchPlot, InvalidInputStillGivesAValidImage) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<std::vector<BenchPoint>> cases = {
      {},                                                                            // no rows
      {{"prefill", 0, 100, 1}, {"decode", -4, 10, 1}},                               // non-positive lengths
      {{"prefill", 256, 0, 0}, {"decode", 256, -3, -1}, {"decode", 512, nan, nan}},  // bad rates
      {{"prefill", 300, 10, 1}, {"prefill", 1000, 29, 1}, {"decode", 100, 5, 0}},    // not powers of two
      {{"prefill", 1, 1e-3, 1}, {"decode", int64_t(1) << 40, 1e12, 1e9}},            // extremes, one point each
      {{"other", 256, 100, 1}},                                                      // unknown kind
  };
  std::string long_title(500, 'x');
  for (size_t i = 0; i < cases.size(); ++i) {
    Decoded d = render_and_decode(cases[i], i % 2 ? long_title : std::string("\x01\xff odd bytes"));
    EXPECT_EQ(d.width, kBenchPlotWidth) << "case " << i;
    EXPECT_EQ(d.height, kBenchPlotHeight) << "case " << i;
    EXPECT_TRUE(is_white(at(d, 0, 0))) << "case " << i;
    EXPECT_TRUE(is_dark(at(d, bench_panel_rect(0).left, bench_panel_rect(0).bottom))) << "case " << i;
  }
  // Non-power-of-two: 300 and 1000 lie between 2^8 and 2^10, at their log2 positions.
  Decoded d = render_and_decode(cases[3], "t");
  PlotRect r = bench_panel_rect(0);
  int x300 = r.left + int(std::lround((std::log2(300.0) - 8) / 2 * (r.right - r.left)));
  int x1000 = r.left + int(std::lround((std::log2(1000.0) - 8) / 2 * (r.right - r.left)));
  // y range: 29 rounds up to 30.
  int y10 = r.bottom - int(std::lround(10.0 / 30 * (r.bottom - r.top)));
  int y30 = r.bottom - int(std::lround(29.0 / 30 * (r.bottom - r.top)));
  EXPECT_TRUE(is_blue(at(d, x300, y10)));
  EXPECT_TRUE(is_blue(at(d, x1000, y30)));
}

TEST(BenchPlot, WriteFailsWithThePathInTheMessage) {
  try {
    write_bench_plot("/nonexistent-dir/x/plot.png", known_points(), "t");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x/plot.png"), std::string::npos) << e.what();
  }
}

// The command end to end, on the tiny fixture model (CPU), when the lily binary is built.
TEST(BenchPlot, LilyBenchWritesAReadablePlot) {
  if (!std::filesystem::exists(LILY_BINARY)) GTEST_SKIP() << "no lily binary at " << LILY_BINARY;
  auto path = std::filesystem::temp_directory_path() / ("lily_bench_plot_" + std::to_string(::getpid()) + ".png");
  std::string cmd = std::string(LILY_BINARY) + " bench -m " + LILY_FIXTURES_DIR +
                    "/models/tiny-a/mlx-q4 --backend cpu --prefill-lengths 64,128 --decode-depths 16,32"
                    " --decode-tokens 2 --repeats 1 --plot " +
                    path.string() + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  Decoded d = decode_png(bytes);
  EXPECT_EQ(d.width, kBenchPlotWidth);
  ASSERT_EQ(d.rgb.size(), size_t(d.width) * size_t(d.height) * 3);
  // Lengths 64 and 128 span [2^6, 2^7]: the markers sit on the left and right edges of each panel.
  auto column_has = [&](int x, const PlotRect& r, bool (*colour)(Px)) {
    for (int y = r.top; y <= r.bottom; ++y)
      if (colour(at(d, x, y))) return true;
    return false;
  };
  PlotRect r = bench_panel_rect(0), q = bench_panel_rect(1);
  EXPECT_TRUE(column_has(r.left + 2, r, is_blue) && column_has(r.right, r, is_blue));
  EXPECT_TRUE(column_has(q.left + 2, q, is_red) && column_has(q.right, q, is_red));
}

}  // namespace
}  // namespace lily::cli
