// Image sizes from file headers alone (JPEG, PNG, GIF, BMP, WebP): what indexing a
// dataset without width/height columns needs, without decoding any pixels: the stored
// size, and a JPEG's EXIF orientation (5-8 swap width and height when it is applied).
// No torch, no OpenCV.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace sana::data {

struct ImageSize {
  int width = 0;
  int height = 0;
  bool ok = false;
  std::string error;  // why not, when !ok: "missing", "empty", "not an image", "truncated"
  int orientation = 1;  // a JPEG's EXIF orientation (1-8)
  // The size as decoded with the EXIF orientation applied or ignored (data.exif_orientation).
  ImageSize as_decoded(bool apply_orientation) const {
    ImageSize s = *this;
    if (apply_orientation && orientation >= 5 && orientation <= 8) std::swap(s.width, s.height);
    return s;
  }
};

// From a file, or a tar shard's member (file_ref.h).
ImageSize read_image_size(const std::string& path);
// From an image's bytes already in memory.
ImageSize read_image_size(const unsigned char* data, size_t size);

// The EXIF orientation (1-8) in a JPEG APP1 segment's body ("Exif\0\0" + TIFF); 1 when
// it has none.
int exif_orientation(const unsigned char* app1_body, size_t size);
// The same from the TIFF structure alone (a PNG's eXIf chunk).
int tiff_orientation(const unsigned char* tiff, size_t size);

}  // namespace sana::data
