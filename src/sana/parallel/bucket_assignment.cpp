#include "sana/parallel/bucket_assignment.h"

#include <algorithm>

namespace sana::parallel {

std::string module_unit(const std::string& name) {
  size_t begin = 0;
  while (begin < name.size()) {
    size_t end = name.find('.', begin);
    if (end == std::string::npos) end = name.size();
    if (end > begin && std::all_of(name.begin() + static_cast<std::ptrdiff_t>(begin),
                                   name.begin() + static_cast<std::ptrdiff_t>(end), [](char c) { return c >= '0' && c <= '9'; })) {
      return name.substr(0, end);
    }
    begin = end + 1;
  }
  return {};
}

std::vector<GradBucket> compute_buckets(const std::vector<ParamInfo>& params, int64_t cap_bytes,
                                        int64_t first_cap_bytes) {
  std::vector<GradBucket> buckets;
  int64_t payload = 0;  // the last bucket's parameter bytes (caps do not count alignment gaps)
  std::string unit;     // the last bucket's module_unit()
  for (size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    const int64_t bytes = p.numel * p.element_size;
    const int64_t cap = buckets.size() <= 1 ? first_cap_bytes : cap_bytes;  // the cap of buckets.back()
    auto p_unit = module_unit(p.name);
    if (buckets.empty() || buckets.back().dtype != p.dtype || p_unit != unit || payload + bytes > cap) {
      buckets.emplace_back();
      buckets.back().dtype = p.dtype;
      payload = 0;
      unit = std::move(p_unit);
    }
    payload += bytes;
    auto& b = buckets.back();
    const int64_t align = std::max<int64_t>(1, kBucketAlignBytes / std::max<int64_t>(1, p.element_size));
    const int64_t start = (b.numel + align - 1) / align * align;
    b.params.push_back(k);
    b.offsets.push_back(start);
    b.numel = start + p.numel;
  }
  return buckets;
}

std::vector<GradBucket> compute_buckets_mb(const std::vector<ParamInfo>& params, double cap_mb, double first_cap_mb) {
  const auto bytes = [](double mb) { return static_cast<int64_t>(mb * 1024 * 1024); };
  return compute_buckets(params, bytes(cap_mb), bytes(first_cap_mb));
}

std::vector<size_t> bucket_of_params(const std::vector<GradBucket>& buckets, size_t param_count) {
  std::vector<size_t> out(param_count);
  for (size_t i = 0; i < buckets.size(); ++i) {
    for (size_t k : buckets[i].params) out.at(k) = i;
  }
  return out;
}

}  // namespace sana::parallel
