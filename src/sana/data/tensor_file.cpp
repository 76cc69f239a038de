#include "sana/data/tensor_file.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <vector>

#include "sana/data/array_file.h"
#include "sana/data/file_ref.h"
#include "sana/util/safetensors.h"

namespace sana::data {

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

std::vector<char> read_all(const std::string& path) {
  std::vector<char> bytes;
  const std::string why = read_ref(path, bytes);
  if (!why.empty()) throw TensorFileError(fmt::format("cannot open '{}': {}", path, why));
  if (bytes.empty()) throw TensorFileError(fmt::format("'{}' is empty", path));
  return bytes;
}

torch::Tensor from_npy(const NpyArray& a, const std::string& name, bool numbers_allowed) {
  torch::ScalarType type;
  const std::string kind = std::string(1, a.kind) + std::to_string(a.itemsize);
  if (kind == "f4") type = torch::kFloat32;
  else if (kind == "f2") type = torch::kFloat16;
  else if (kind == "f8") type = torch::kFloat64;
  else if (numbers_allowed && (kind == "b1" || kind == "u1")) type = torch::kUInt8;
  else if (numbers_allowed && kind == "i1") type = torch::kInt8;
  else if (numbers_allowed && kind == "i2") type = torch::kInt16;
  else if (numbers_allowed && kind == "i4") type = torch::kInt32;
  else if (numbers_allowed && kind == "i8") type = torch::kInt64;
  else throw TensorFileError(fmt::format("'{}' holds dtype {}; features must be floating point", name, kind));
  auto t = torch::empty(a.shape, torch::TensorOptions().dtype(type));
  if (a.bytes > 0) std::memcpy(t.data_ptr(), a.data, a.bytes);
  return t.to(torch::kFloat32);
}

// The arrays of a file by name ("" for a lone .npy), read on demand.
class ArrayFile {
 public:
  explicit ArrayFile(const std::string& path) : path_(path), bytes_(read_all(path)) {
    const std::string name = format_name(path);
    if (ends_with(name, ".npz")) {
      npz_ = parse_npz(bytes_.data(), bytes_.size(), path);
      names_ = npz_->names;
    } else if (ends_with(name, ".safetensors")) {
      try {
        safetensors_ = parse_safetensors(bytes_, path);
      } catch (const SafetensorsError& e) {
        throw TensorFileError(e.what());  // a damaged feature file is a bad sample
      }
      for (const auto& named : safetensors_->tensors) names_.push_back(named.first);
    } else if (!ends_with(name, ".npy")) {
      throw TensorFileError(fmt::format("'{}' is neither .npy, .npz nor .safetensors", path));
    }
    if (names_.empty()) names_.push_back("");  // a lone .npy array
  }
  bool has(const std::string& name) const { return std::find(names_.begin(), names_.end(), name) != names_.end(); }
  torch::Tensor get(const std::string& name, bool numbers_allowed = false) const {
    if (npz_) return from_npy(npz_->array(npz_->find(name), path_), path_ + ":" + name, numbers_allowed);
    if (safetensors_) {
      const torch::Tensor t = safetensors_->get(name);
      if (!numbers_allowed && !torch::isFloatingType(t.scalar_type())) {
        throw TensorFileError(fmt::format("'{}': tensor '{}' has dtype {}; features must be floating point", path_,
                                          name, c10::toString(t.scalar_type())));
      }
      return t.to(torch::kFloat32);
    }
    return from_npy(parse_npy(bytes_.data(), bytes_.size(), path_), path_, numbers_allowed);
  }
  // `wanted` if present, else the first of `fallbacks` present, else the lone array.
  std::string pick(const std::string& wanted, std::initializer_list<const char*> fallbacks) const {
    const auto& all = names_;
    if (!wanted.empty()) {
      if (has(wanted)) return wanted;
      throw TensorFileError(fmt::format("'{}' has no array '{}' (it has: {})", path_, wanted, fmt::join(all, ", ")));
    }
    for (const char* f : fallbacks) {
      if (has(f)) return f;
    }
    if (all.size() == 1) return all[0];
    throw TensorFileError(fmt::format("'{}' holds several arrays ({}); name one", path_, fmt::join(all, ", ")));
  }

 private:
  std::string path_;
  std::vector<char> bytes_;
  std::optional<NpzFile> npz_;
  std::optional<SafetensorsFile> safetensors_;
  std::vector<std::string> names_;  // its arrays' names; "" alone for a .npy
};

// Any failure reading `path` as a TensorFileError: a damaged file must never be more than
// a bad sample (array format errors, JSON type errors, c10 errors).
template <class Read>
auto guarded(const std::string& path, Read&& read) {
  try {
    return read();
  } catch (const TensorFileError&) {
    throw;
  } catch (const ArrayFileError& e) {
    throw TensorFileError(e.what());
  } catch (const std::exception& e) {
    throw TensorFileError(fmt::format("'{}' is damaged: {}", path, e.what()));
  }
}

}  // namespace

torch::Tensor read_tensor_file(const std::string& path, const std::string& key) {
  return guarded(path, [&] {
    const ArrayFile file(path);
    return file.get(file.pick(key, {"z"}));  // "z": upstream's latent cache key
  });
}

TextFeatures read_text_features(const std::string& path) {
  return guarded(path, [&] {
    const ArrayFile file(path);
    TextFeatures out;
    out.features = file.get(file.has("caption_feature") ? "caption_feature" : file.pick("", {}));
    if (out.features.dim() == 3 && out.features.size(0) == 1) out.features = out.features[0];
    if (file.has("attention_mask")) {
      out.mask = file.get("attention_mask", true).reshape({-1}).ne(0).to(torch::kFloat32);
      if (out.features.dim() == 2 && out.mask.size(0) != out.features.size(0)) {
        throw TensorFileError(fmt::format("'{}': attention_mask has {} entries for {} tokens", path,
                                          out.mask.size(0), out.features.size(0)));
      }
    }
    return out;
  });
}

}  // namespace sana::data
