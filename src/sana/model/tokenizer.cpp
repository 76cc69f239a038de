#include "sana/model/tokenizer.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <filesystem>

#include "sana/util/error.h"

namespace sana::model {

namespace {

bool is_t5(const std::string& encoder_name) { return encoder_name.rfind("T5", 0) == 0; }

// Where libsana_spm.so may be: beside the executable, where the build put it, or on the
// loader's path.
std::vector<std::string> module_candidates() {
  std::vector<std::string> out;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) out.push_back((exe.parent_path() / "libsana_spm.so").string());
#ifdef SANA_SPM_MODULE
  out.push_back(SANA_SPM_MODULE);
#endif
  out.push_back("libsana_spm.so");
  return out;
}

}  // namespace

struct CaptionTokenizer::Module {
  void* library = nullptr;
  void* model = nullptr;
  void* (*load)(const char*, char*, size_t) = nullptr;
  int (*encode)(void*, const char*, size_t, int*, int) = nullptr;
  int (*special)(void*, int) = nullptr;
  void (*free)(void*) = nullptr;
  ~Module() {
    if (model) free(model);
    if (library) dlclose(library);
  }
};

CaptionTokenizer::CaptionTokenizer(const std::string& path, const std::string& encoder_name)
    : spm_(std::make_unique<Module>()) {
  auto fail = [&](const std::string& why) {
    return UsageError(fmt::format("text_encoder.tokenizer_path '{}': {}", path, why), "encoder error");
  };
  // Deep binding keeps SentencePiece's own protobuf away from LibTorch's; sanitizers refuse it.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const int flags = RTLD_NOW | RTLD_LOCAL;
#else
  const int flags = RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND;
#endif
  std::string tried;
  for (const auto& candidate : module_candidates()) {
    spm_->library = dlopen(candidate.c_str(), flags);
    if (spm_->library) break;
    tried += fmt::format("\n  {}: {}", candidate, dlerror());
  }
  if (!spm_->library) {
    throw fail("this sana-train cannot tokenize: libsana_spm.so (built when libsentencepiece-dev is installed) was "
               "not found:" + tried);
  }
  spm_->load = reinterpret_cast<decltype(spm_->load)>(dlsym(spm_->library, "sana_spm_load"));
  spm_->encode = reinterpret_cast<decltype(spm_->encode)>(dlsym(spm_->library, "sana_spm_encode"));
  spm_->special = reinterpret_cast<decltype(spm_->special)>(dlsym(spm_->library, "sana_spm_special"));
  spm_->free = reinterpret_cast<decltype(spm_->free)>(dlsym(spm_->library, "sana_spm_free"));
  if (!spm_->load || !spm_->encode || !spm_->special || !spm_->free) throw fail("libsana_spm.so is incomplete");
  std::array<char, 512> error{};
  spm_->model = spm_->load(path.c_str(), error.data(), error.size());
  if (!spm_->model) {
    throw fail(fmt::format("not a SentencePiece model ({}); give the encoder's tokenizer.model", error.data()));
  }
  // Gemma's (and Gemma-2's) tokenizer adds BOS; T5's adds EOS. Both pad with id 0.
  eos_ = is_t5(encoder_name);
  bos_ = !eos_;
  if (spm_->special(spm_->model, eos_ ? 1 : 0) < 0) {
    throw fail(fmt::format("the model has no {} token, which {} needs", bos_ ? "BOS" : "EOS", encoder_name));
  }
  pad_ = std::max(0, spm_->special(spm_->model, 2));
}

CaptionTokenizer::~CaptionTokenizer() = default;
CaptionTokenizer::CaptionTokenizer(CaptionTokenizer&&) noexcept = default;

std::vector<int64_t> CaptionTokenizer::encode(const std::string& text) const {
  std::vector<int> pieces(text.size() + 8);
  int n = spm_->encode(spm_->model, text.data(), text.size(), pieces.data(), static_cast<int>(pieces.size()));
  if (n > static_cast<int>(pieces.size())) {
    pieces.resize(static_cast<size_t>(n));
    n = spm_->encode(spm_->model, text.data(), text.size(), pieces.data(), n);
  }
  std::vector<int64_t> ids;
  if (bos_) ids.push_back(spm_->special(spm_->model, 0));
  ids.insert(ids.end(), pieces.begin(), pieces.begin() + n);
  if (eos_) ids.push_back(spm_->special(spm_->model, 1));
  return ids;
}

TokenBatch CaptionTokenizer::batch(const std::vector<std::string>& texts, int64_t length) const {
  TokenBatch b;
  b.rows = static_cast<int64_t>(texts.size());
  b.length = length;
  b.ids.assign(static_cast<size_t>(b.rows * length), pad_);
  b.mask.assign(static_cast<size_t>(b.rows * length), 0);
  for (int64_t r = 0; r < b.rows; ++r) {
    auto ids = encode(texts[static_cast<size_t>(r)]);
    if (static_cast<int64_t>(ids.size()) > length) {
      const int64_t last = ids.back();
      ids.resize(static_cast<size_t>(length));
      if (eos_ && length > 0) ids.back() = last;  // HF truncates the text, then adds EOS
    }
    std::copy(ids.begin(), ids.end(), b.ids.begin() + r * length);
    std::fill_n(b.mask.begin() + r * length, ids.size(), 1);
  }
  return b;
}

std::vector<int64_t> select_index(int64_t length, int64_t keep) {
  std::vector<int64_t> out = {0};
  for (int64_t i = length - (keep - 1); i < length; ++i) out.push_back(i);
  return out;
}

CaptionPlan plan_captions(const std::vector<std::string>& captions, const std::vector<std::string>& chi_prompt,
                          const std::string& encoder_name, int64_t model_max_length,
                          const std::function<int64_t(const std::string&)>& count_tokens) {
  CaptionPlan plan;
  plan.length = model_max_length;
  if (chi_prompt.empty() || is_t5(encoder_name)) {
    plan.texts = captions;
  } else {
    const std::string chi = fmt::format("{}", fmt::join(chi_prompt, "\n"));
    for (const auto& c : captions) plan.texts.push_back(chi + c);
    plan.length = count_tokens(chi) + model_max_length - 2;  // upstream: [bos] and one more
  }
  plan.keep = select_index(plan.length, model_max_length);
  return plan;
}

}  // namespace sana::model
