#include "sana/data/image_header.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "sana/data/file_ref.h"

namespace sana::data {

namespace {

uint32_t be16(const uint8_t* p) { return static_cast<uint32_t>(p[0] << 8 | p[1]); }
uint32_t be32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 |
         static_cast<uint32_t>(p[2]) << 8 | p[3];
}
uint32_t le16(const uint8_t* p) { return static_cast<uint32_t>(p[0] | p[1] << 8); }
uint32_t le24(const uint8_t* p) { return static_cast<uint32_t>(p[0] | p[1] << 8 | p[2] << 16); }
uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

ImageSize fail(const char* why) {
  ImageSize s;
  s.error = why;
  return s;
}

ImageSize make(uint32_t w, uint32_t h) {
  if (w == 0 || h == 0 || w > 1u << 20 || h > 1u << 20) return fail("corrupt header");
  ImageSize s;
  s.width = static_cast<int>(w);
  s.height = static_cast<int>(h);
  s.ok = true;
  return s;
}

ImageSize jpeg_size(std::FILE* f) {
  // Walk the segments up to a start-of-frame marker.
  int orientation = 1;
  uint8_t m[4];
  while (std::fread(m, 1, 2, f) == 2) {
    if (m[0] != 0xFF) {
      // Stray bytes before a marker: libjpeg skips them to the next 0xFF and decodes on, so
      // must we, or the decoder would meet a frame (and a size) this check never saw.
      int c = m[1];
      while (c != 0xFF) {
        if ((c = std::fgetc(f)) == EOF) return fail("truncated");
      }
      if ((c = std::fgetc(f)) == EOF) return fail("truncated");
      m[0] = 0xFF;
      m[1] = static_cast<uint8_t>(c);
    }
    const uint8_t marker = m[1];
    if (marker == 0xD8 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD7)) continue;
    if (marker == 0xFF) {
      std::fseek(f, -1, SEEK_CUR);
      continue;
    }
    if (std::fread(m, 1, 2, f) != 2) return fail("truncated");
    const uint32_t seg = be16(m);
    if (seg < 2) return fail("corrupt header");
    const bool sof = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
                     marker != 0xCC;
    if (sof) {
      uint8_t s[5];
      if (std::fread(s, 1, 5, f) != 5) return fail("truncated");
      const uint32_t h = be16(s + 1), w = be16(s + 3);
      ImageSize out = make(w, h);
      if (out.ok) out.orientation = orientation;
      return out;
    }
    if (marker == 0xE1 && seg > 16) {
      std::vector<uint8_t> body(seg - 2);
      if (std::fread(body.data(), 1, body.size(), f) != body.size()) return fail("truncated");
      const int o = exif_orientation(body.data(), body.size());
      if (o != 1) orientation = o;
      continue;
    }
    if (std::fseek(f, static_cast<long>(seg - 2), SEEK_CUR) != 0) return fail("truncated");
  }
  return fail("truncated");
}

// The size from an open stream whose first byte is the image's; closes it.
ImageSize size_from_stream(std::FILE* f) {
  uint8_t h[32] = {};
  const size_t n = std::fread(h, 1, sizeof h, f);
  ImageSize out;
  if (n == 0) {
    out = fail("empty");
  } else if (n >= 3 && h[0] == 0xFF && h[1] == 0xD8 && h[2] == 0xFF) {
    std::fseek(f, 2, SEEK_SET);
    out = jpeg_size(f);
  } else if (n >= 24 && std::memcmp(h, "\x89PNG\r\n\x1a\n", 8) == 0) {
    out = make(be32(h + 16), be32(h + 20));
  } else if (n >= 10 && (std::memcmp(h, "GIF87a", 6) == 0 || std::memcmp(h, "GIF89a", 6) == 0)) {
    out = make(le16(h + 6), le16(h + 8));
  } else if (n >= 26 && h[0] == 'B' && h[1] == 'M') {
    const int64_t bh = static_cast<int32_t>(le32(h + 22));
    out = make(le32(h + 18), static_cast<uint32_t>(bh < 0 ? -bh : bh));
  } else if (n >= 30 && std::memcmp(h, "RIFF", 4) == 0 && std::memcmp(h + 8, "WEBP", 4) == 0) {
    if (std::memcmp(h + 12, "VP8 ", 4) == 0) {
      out = make(le16(h + 26) & 0x3FFF, le16(h + 28) & 0x3FFF);
    } else if (std::memcmp(h + 12, "VP8L", 4) == 0) {
      const uint32_t b = le32(h + 21);
      out = make((b & 0x3FFF) + 1, ((b >> 14) & 0x3FFF) + 1);
    } else if (std::memcmp(h + 12, "VP8X", 4) == 0) {
      out = make(le24(h + 24) + 1, le24(h + 27) + 1);
    } else {
      out = fail("corrupt header");
    }
  } else if (n < 8) {
    out = fail("truncated");
  } else {
    out = fail("not an image");
  }
  std::fclose(f);
  return out;
}

}  // namespace

int exif_orientation(const uint8_t* p, size_t n) {
  if (n < 14 || std::memcmp(p, "Exif\0\0", 6) != 0) return 1;
  return tiff_orientation(p + 6, n - 6);
}

int tiff_orientation(const uint8_t* tiff, size_t len) {
  if (len < 8) return 1;
  const bool little = tiff[0] == 'I';
  auto u16 = [&](size_t off) { return off + 2 <= len ? (little ? le16(tiff + off) : be16(tiff + off)) : 0u; };
  auto u32 = [&](size_t off) { return off + 4 <= len ? (little ? le32(tiff + off) : be32(tiff + off)) : 0u; };
  const size_t ifd = u32(4);
  const uint32_t entries = u16(ifd);
  for (uint32_t i = 0; i < entries; ++i) {
    const size_t e = ifd + 2 + 12 * static_cast<size_t>(i);
    if (e + 12 > len) break;
    if (u16(e) == 0x0112) return static_cast<int>(u16(e + 8));
  }
  return 1;
}


ImageSize read_image_size(const std::string& path) {
  if (!parse_file_ref(path).in_tar()) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    return f == nullptr ? fail("missing") : size_from_stream(f);
  }
  // A tar member is read whole (images, a few MB) and parsed from memory.
  std::vector<unsigned char> member;
  if (!read_ref(path, member).empty()) return fail("missing");
  return read_image_size(member.data(), member.size());
}

ImageSize read_image_size(const unsigned char* data, size_t size) {
  if (size == 0) return fail("empty");
  // fmemopen's seeks stay inside the buffer, so the stream parser needs no second variant.
  std::FILE* f = fmemopen(const_cast<unsigned char*>(data), size, "rb");
  return f == nullptr ? fail("missing") : size_from_stream(f);
}

}  // namespace sana::data
