#include "sana/data/jpeg_dc.h"

// jpeglib.h needs size_t and FILE declared first.
#include <algorithm>
#include <array>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <jpeglib.h>

#include "sana/data/image_header.h"

namespace sana::data {

namespace {

bool is_frame_marker(uint8_t m) {  // SOF0-SOF15 but DHT (C4), JPG (C8) and DAC (CC)
  return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
}

bool is_restart(uint8_t m) { return m >= 0xD0 && m <= 0xD7; }

// The index of the marker that ends the entropy-coded data starting at `i` (stuffed
// 0xFF00 bytes and restart markers belong to the data); `n` when none does.
size_t end_of_scan(const uint8_t* d, size_t n, size_t i) {
  while (i + 1 < n) {
    const void* ff = std::memchr(d + i, 0xFF, n - 1 - i);
    if (ff == nullptr) return n;
    i = static_cast<size_t>(static_cast<const uint8_t*>(ff) - d);
    const uint8_t next = d[i + 1];
    if (next != 0x00 && next != 0xFF && !is_restart(next)) return i;
    i += next == 0xFF ? 1 : 2;  // 0xFF 0xFF: fill bytes before a marker
  }
  return n;
}

// What the scan headers send of each component's coefficients, down to which bit. libjpeg
// smooths its output wherever some coefficient has not arrived to its last bit (guessing
// AC coefficients; libjpeg-turbo 2.1 also adjusts the DC), so only a file whose scans
// complete every coefficient of every component takes the DC path: there the whole file
// gets no smoothing, and neither does the DC copy.
class Progression {
 public:
  Progression() { bits_.fill({}); }
  bool frame(const uint8_t* seg, size_t len) {  // SOF2: Nf x (id, sampling, table)
    if (len < 8 || len != 8 + 3 * static_cast<size_t>(seg[9])) return false;
    for (size_t c = 0; c < seg[9]; ++c) {
      ids_.push_back(seg[10 + 3 * c]);
      bits_[ids_.back()].fill(-1);
    }
    return true;
  }
  bool scan(const uint8_t* seg, size_t components) {  // SOS header: a well-formed one?
    const uint8_t* p = seg + 5 + 2 * components;
    const int ss = p[0], se = p[1], ah = p[2] >> 4, al = p[2] & 15;
    if (se > 63 || ss > se || (ss == 0) != (se == 0) || ah > 13 || al > 13) return false;
    if (ss > 0 && components != 1) return false;  // AC scans are never interleaved
    for (size_t c = 0; c < components; ++c) {
      const uint8_t id = seg[5 + 2 * c];
      if (std::find(ids_.begin(), ids_.end(), id) == ids_.end()) return false;
      for (int k = ss; k <= se; ++k) bits_[id][static_cast<size_t>(k)] = static_cast<int8_t>(al);
    }
    return true;
  }
  bool complete() const {
    if (ids_.empty()) return false;
    for (uint8_t id : ids_) {
      for (int8_t b : bits_[id]) {
        if (b != 0) return false;
      }
    }
    return true;
  }

 private:
  std::vector<uint8_t> ids_;
  std::array<std::array<int8_t, 64>, 256> bits_;  // -1: not yet sent
};

void on_error(j_common_ptr c);
void on_message(j_common_ptr, int) {}  // warnings: the output decides, not libjpeg's chatter

// libjpeg reports errors by longjmp: the functions that set the jump buffer hold no object
// with a destructor (an output lives in the caller's frame), so jumping back skips none.
struct ErrorManager {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  explicit ErrorManager(jpeg_decompress_struct& cinfo) {
    cinfo.err = jpeg_std_error(&pub);
    pub.error_exit = on_error;
    pub.emit_message = on_message;
  }
};

void on_error(j_common_ptr c) { std::longjmp(reinterpret_cast<ErrorManager*>(c->err)->jump, 1); }

// Reads the header of `data` and asks for 1/8 scale; errors jump to the caller's setjmp.
void open_eighth(jpeg_decompress_struct& cinfo, const uint8_t* data, size_t size) {
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  cinfo.scale_num = 1;
  cinfo.scale_denom = 8;
}

// Which components (by id) libjpeg's 1/8-scale output takes AC coefficients of. Most get
// one pixel per block from the DC alone, but libjpeg scales a subsampled component by its
// inverse DCT rather than by upsampling where it can (a 4:2:0 image's chroma: 2x2 pixels
// per block, from the odd AC frequencies too); those keep their AC scans. False when the
// header cannot be read.
bool components_needing_ac(const uint8_t* data, size_t size, std::array<bool, 256>& needs_ac) {
  jpeg_decompress_struct cinfo;
  ErrorManager err(cinfo);
  if (setjmp(err.jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  open_eighth(cinfo, data, size);
  jpeg_calc_output_dimensions(&cinfo);
  needs_ac.fill(false);
  for (int ci = 0; ci < cinfo.num_components; ++ci) {
    const jpeg_component_info& c = cinfo.comp_info[ci];
    needs_ac[static_cast<size_t>(c.component_id & 0xFF)] = c.DCT_scaled_size > 1;
  }
  jpeg_destroy_decompress(&cinfo);
  return true;
}

bool decode_eighth(const std::vector<uint8_t>& stream, cv::Mat& out) {
  jpeg_decompress_struct cinfo;
  ErrorManager err(cinfo);
  if (setjmp(err.jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  open_eighth(cinfo, stream.data(), stream.size());
  if (!cinfo.progressive_mode || cinfo.num_components != 3 || cinfo.jpeg_color_space != JCS_YCbCr) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  cinfo.out_color_space = JCS_EXT_BGR;  // as OpenCV asks for it
  cinfo.do_block_smoothing = FALSE;
  jpeg_start_decompress(&cinfo);
  out.create(static_cast<int>(cinfo.output_height), static_cast<int>(cinfo.output_width), CV_8UC3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out.ptr(static_cast<int>(cinfo.output_scanline));
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

}  // namespace

std::vector<uint8_t> progressive_dc_stream(const uint8_t* d, size_t n) {
  if (n < 4 || d[0] != 0xFF || d[1] != 0xD8) return {};
  std::array<bool, 256> needs_ac{};
  std::vector<uint8_t> out(d, d + 2);
  out.reserve(n / 8);
  bool progressive = false;
  Progression sent;
  size_t i = 2;
  for (;;) {
    if (i + 1 >= n || d[i] != 0xFF) return {};
    while (i + 1 < n && d[i + 1] == 0xFF) ++i;  // fill bytes
    if (i + 1 >= n) return {};
    const uint8_t m = d[i + 1];
    if (m == 0xD9) break;                         // EOI
    if (m == 0x01 || is_restart(m) || m == 0xD8) return {};  // no length: none belongs here
    if (i + 4 > n) return {};
    const size_t len = static_cast<size_t>(d[i + 2]) << 8 | d[i + 3];
    if (len < 2 || i + 2 + len > n) return {};
    const uint8_t* seg = d + i;
    if (is_frame_marker(m)) {
      if (m != 0xC2) return {};  // baseline, lossless or arithmetic-coded: all of it is needed
      if (progressive || !sent.frame(seg, len)) return {};
      // Asked only now: a baseline file (most of them) costs no libjpeg header read here.
      if (!components_needing_ac(d, n, needs_ac)) return {};
      progressive = true;
    }
    if (m == 0xE1 && exif_orientation(seg + 4, len - 2) != 1) return {};
    if (m != 0xDA) {
      out.insert(out.end(), seg, seg + 2 + len);
      i += 2 + len;
      continue;
    }
    // SOS: Ns, Ns x (component, tables), Ss, Se, Ah/Al; then the entropy-coded data.
    if (!progressive || len < 6) return {};
    const size_t components = seg[4];
    if (len != 6 + 2 * components || components == 0 || !sent.scan(seg, components)) return {};
    bool keep = seg[5 + 2 * components] == 0;  // spectral selection from the DC coefficient
    for (size_t c = 0; c < components; ++c) keep = keep || needs_ac[seg[5 + 2 * c]];
    const size_t end = end_of_scan(d, n, i + 2 + len);
    if (end >= n) return {};  // the file ends inside a scan
    if (keep) out.insert(out.end(), seg, d + end);
    i = end;
  }
  if (!progressive || !sent.complete()) return {};
  out.push_back(0xFF);
  out.push_back(0xD9);
  return out;
}

cv::Mat decode_progressive_eighth(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> stream = progressive_dc_stream(data, size);
  cv::Mat out;
  if (stream.empty() || !decode_eighth(stream, out)) return {};
  return out;
}

}  // namespace sana::data
