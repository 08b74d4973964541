// png_writer.cpp: PNG = signature, IHDR, IDAT (zlib of stored deflate blocks), IEND.
#include "cli/png_writer.h"

#include <algorithm>
#include <array>
#include <cstdio>

#include "base/error.h"

namespace lily::cli {
namespace {

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t n = 0; n < 256; ++n) {
    uint32_t c = n;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    table[n] = c;
  }
  return table;
}

void put_u32_be(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(v >> shift));
}

// length (4, big-endian), type (4), data, CRC32 over type and data (4).
void put_chunk(std::vector<uint8_t>& out, const char type[4], std::span<const uint8_t> data) {
  put_u32_be(out, uint32_t(data.size()));
  size_t crc_from = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  put_u32_be(out, png_crc32(std::span<const uint8_t>(out).subspan(crc_from)));
}

// RFC 1950 header, RFC 1951 §3.2.4 stored blocks (BFINAL, BTYPE=00, padded to a byte, then
// LEN and NLEN little-endian, then LEN raw bytes), adler32 of the raw data, big-endian.
std::vector<uint8_t> zlib_stored(std::span<const uint8_t> raw) {
  constexpr size_t kMaxBlock = 65535;
  std::vector<uint8_t> z;
  z.reserve(raw.size() + raw.size() / kMaxBlock * 5 + 16);
  z.push_back(0x78);  // CM = 8 (deflate), CINFO = 7 (32 KiB window)
  z.push_back(0x01);  // FLEVEL = 0, no dictionary; 0x7801 % 31 == 0 as FCHECK requires
  size_t pos = 0;
  do {
    size_t n = std::min(kMaxBlock, raw.size() - pos);
    bool last = pos + n == raw.size();
    z.push_back(last ? 1 : 0);
    z.push_back(uint8_t(n & 0xff));
    z.push_back(uint8_t(n >> 8));
    z.push_back(uint8_t(~n & 0xff));
    z.push_back(uint8_t((~n >> 8) & 0xff));
    z.insert(z.end(), raw.begin() + pos, raw.begin() + pos + n);
    pos += n;
  } while (pos < raw.size());
  put_u32_be(z, zlib_adler32(raw));
  return z;
}

}  // namespace

uint32_t png_crc32(std::span<const uint8_t> bytes) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  uint32_t c = 0xFFFFFFFFu;
  for (uint8_t b : bytes) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t zlib_adler32(std::span<const uint8_t> bytes) {
  constexpr uint32_t kMod = 65521;
  uint32_t a = 1, b = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    size_t end = std::min(bytes.size(), i + 5552);  // largest run before b can overflow 32 bits
    for (; i < end; ++i) {
      a += bytes[i];
      b += a;
    }
    a %= kMod;
    b %= kMod;
  }
  return (b << 16) | a;
}

std::vector<uint8_t> encode_png_rgb(int width, int height, std::span<const uint8_t> rgb) {
  LILY_CHECK(width > 0 && height > 0, "PNG: image size must be positive, got {}x{}", width, height);
  LILY_CHECK(rgb.size() == size_t(width) * size_t(height) * 3, "PNG: {}x{} RGB needs {} bytes, got {}", width, height,
             size_t(width) * size_t(height) * 3, rgb.size());
  // Scanlines: filter type 0 (None), then the row's RGB bytes.
  const size_t row_bytes = size_t(width) * 3;
  std::vector<uint8_t> raw;
  raw.reserve(size_t(height) * (row_bytes + 1));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);
    auto row = rgb.subspan(size_t(y) * row_bytes, row_bytes);
    raw.insert(raw.end(), row.begin(), row.end());
  }

  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<uint8_t> ihdr;
  put_u32_be(ihdr, uint32_t(width));
  put_u32_be(ihdr, uint32_t(height));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // bit depth 8, colour type 2 (RGB), deflate, filter 0, no interlace
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", zlib_stored(raw));
  put_chunk(png, "IEND", {});
  return png;
}

void write_png_rgb(const std::string& path, int width, int height, std::span<const uint8_t> rgb) {
  std::vector<uint8_t> png = encode_png_rgb(width, height, rgb);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  LILY_CHECK(f != nullptr, "writing {}: cannot open the file for writing", path);
  size_t written = std::fwrite(png.data(), 1, png.size(), f);
  bool closed = std::fclose(f) == 0;
  LILY_CHECK(written == png.size() && closed, "writing {}: wrote {} of {} bytes", path, written, png.size());
}

}  // namespace lily::cli
