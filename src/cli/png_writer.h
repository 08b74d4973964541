// png_writer.h: a minimal PNG encoder for 8-bit RGB images, with no dependencies.
//
// The file is the signature, IHDR (8-bit truecolour, no interlace), one IDAT holding a zlib
// stream of *stored* (uncompressed) deflate blocks of at most 65,535 bytes with the adler32
// trailer, and IEND; each chunk ends with the CRC32 of its type and data (PNG spec §5.3).
// The images are small charts, so skipping compression costs only file size (~3 bytes/pixel).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace lily::cli {

// CRC-32 as PNG and zlib use it (reflected polynomial 0xEDB88320, init and final xor ~0).
uint32_t png_crc32(std::span<const uint8_t> bytes);

// Adler-32 as the zlib trailer uses it (RFC 1950 §8.2).
uint32_t zlib_adler32(std::span<const uint8_t> bytes);

// rgb: [height, width, 3] uint8, row-major. Throws lily::Error if the sizes disagree.
std::vector<uint8_t> encode_png_rgb(int width, int height, std::span<const uint8_t> rgb);

// encode_png_rgb, written to `path`; throws lily::Error naming the path if writing fails.
void write_png_rgb(const std::string& path, int width, int height, std::span<const uint8_t> rgb);

}  // namespace lily::cli
