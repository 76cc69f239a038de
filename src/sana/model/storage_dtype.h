// What a frozen base's layer weights are kept in (train.frozen_base_dtype; the layers:
// model/frozen_storage.h). No torch here, so the config mapping can name it.
#pragma once

#include <optional>
#include <string>

namespace sana::model {

// nf4_dq: NF4 with its block scales quantised again (train.frozen_base_double_quant).
enum class StorageDtype { fp32, bf16, fp16, int8, fp8, nf4, nf4_dq };

inline std::string storage_dtype_name(StorageDtype d) {
  switch (d) {
    case StorageDtype::bf16: return "bf16";
    case StorageDtype::fp16: return "fp16";
    case StorageDtype::int8: return "int8";
    case StorageDtype::fp8: return "fp8";
    case StorageDtype::nf4: return "nf4";
    case StorageDtype::nf4_dq: return "nf4-dq";
    case StorageDtype::fp32: break;
  }
  return "fp32";
}

// The config that stores a base in the dtype named `name` (a checksum's prefix), for an
// error that says what to set.
inline std::string storage_dtype_setting(const std::string& name) {
  if (name == "nf4-dq") return "train.frozen_base_dtype: nf4 with train.frozen_base_double_quant: true";
  if (name == "nf4") return "train.frozen_base_dtype: nf4 with train.frozen_base_double_quant: false";
  return "train.frozen_base_dtype: " + name;
}

// A frozen base's checksum as checkpoints record it: a base stored in less than fp32 names
// its dtype first (int8:0123abcd...), so what trained on it resumes on the same storage only
// (model/weights.h's check_saved_base reads the prefix back).
inline std::string stored_base_checksum(StorageDtype d, const std::string& sum) {
  return d == StorageDtype::fp32 ? sum : storage_dtype_name(d) + ":" + sum;
}

}  // namespace sana::model
