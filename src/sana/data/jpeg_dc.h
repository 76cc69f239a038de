// Progressive JPEGs decoded at 1/8 scale from their DC scans alone.
//
// At scale 1/8 libjpeg's inverse DCT of a block is its DC coefficient alone (an 8x8 block
// becomes one pixel), so the AC coefficients change nothing of the output. A progressive
// JPEG sends them in scans of their own, and those scans are most of its bytes (92-96% of
// the example photos) and most of the decoding time. decode_progressive_eighth() keeps
// every segment but those AC scans and decodes that stream with libjpeg's block smoothing
// off (smoothing would guess the missing AC coefficients from the neighbouring blocks):
// the same pixels as OpenCV's IMREAD_REDUCED_COLOR_8 decode of the whole file, sooner.
// One exception, asked of libjpeg itself: a component it scales by its inverse DCT
// rather than by upsampling (a 4:2:0 image's chroma, 2x2 pixels per block) needs its AC
// coefficients, so its AC scans stay. And libjpeg smooths the output of a file whose
// scans leave some coefficient short of its last bit, so only complete files qualify.
// docs/data.md, "Decoding", has the measured figures.
#pragma once

#include <cstddef>
#include <cstdint>
#include <opencv2/core.hpp>
#include <vector>

namespace sana::data {

// The JPEG without the AC scans (spectral selection past the DC coefficient) of the
// components that need only their DC at 1/8, ending in EOI; empty when `data` is not a
// progressive (SOF2) JPEG whose scans complete every coefficient, has an EXIF orientation
// other than 1, or its segments cannot be walked to the end.
std::vector<uint8_t> progressive_dc_stream(const uint8_t* data, size_t size);

// 8-bit BGR at 1/8 scale, pixel for pixel what cv::imdecode(whole file,
// IMREAD_REDUCED_COLOR_8) gives; an empty Mat where this path does not apply (see
// progressive_dc_stream; also anything but 3-component YCbCr, or a libjpeg error): the
// caller decodes the usual way then.
cv::Mat decode_progressive_eighth(const uint8_t* data, size_t size);

}  // namespace sana::data
