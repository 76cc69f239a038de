// NumPy .npy and .npz files written without torch or NumPy: what `sana-train
// prepare-features` writes and data/array_file.h (and NumPy's np.load) reads. An .npy is
// format 1.0 (little-endian, C order, header padded to 64 bytes); an .npz is a zip of
// .npy members, stored (no compression) as np.savez writes them. Files appear whole or not
// at all: written under a temporary name beside the target, flushed, then renamed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace sana::data {

// One array to write: its NumPy type code ("<f4", "<i8", "<f2", ...), shape and bytes.
struct ArrayToWrite {
  std::string name;  // the member name in an .npz ("caption_feature"); unused for .npy
  std::string descr;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t bytes = 0;  // must equal the shape's elements x the type's size
};

// The bytes of one .npy file.
std::string npy_bytes(const ArrayToWrite& array);
// The bytes of an .npz archive holding `arrays` as <name>.npy members.
std::string npz_bytes(const std::vector<ArrayToWrite>& arrays);

// Writes `bytes` to `path` atomically (temporary file in the same folder, fsync, rename).
// Throws RunError naming the file and the system's reason.
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace sana::data
