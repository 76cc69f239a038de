// A C interface to SentencePiece, built as its own module (libsana_spm.so) and opened with
// dlopen(RTLD_LOCAL | RTLD_DEEPBIND) by model/tokenizer.cpp only when a run names a tokenizer.
// Debian's libsentencepiece carries its own copy of protobuf-lite; linked into the program
// beside LibTorch's libprotobuf, the two clash at start-up (a crash before main). Loaded
// locally and bound deep, its protobuf stays its own.
#include <sentencepiece_processor.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

extern "C" {

// A loaded model, or nullptr with the reason in `error`.
void* sana_spm_load(const char* path, char* error, size_t error_size) {
  auto* sp = new sentencepiece::SentencePieceProcessor();
  const auto status = sp->Load(path);
  if (status.ok()) return sp;
  std::strncpy(error, status.ToString().c_str(), error_size - 1);
  error[error_size - 1] = '\0';
  delete sp;
  return nullptr;
}

// The piece ids of `text`: writes at most `capacity` and returns how many there are.
int sana_spm_encode(void* model, const char* text, size_t length, int* out, int capacity) {
  std::vector<int> ids;
  static_cast<sentencepiece::SentencePieceProcessor*>(model)->Encode(std::string(text, length), &ids);
  for (int i = 0; i < capacity && i < static_cast<int>(ids.size()); ++i) out[i] = ids[static_cast<size_t>(i)];
  return static_cast<int>(ids.size());
}

// 0: BOS id, 1: EOS id, 2: pad id (-1 when the model has none).
int sana_spm_special(void* model, int which) {
  const auto* sp = static_cast<sentencepiece::SentencePieceProcessor*>(model);
  return which == 0 ? sp->bos_id() : which == 1 ? sp->eos_id() : sp->pad_id();
}

void sana_spm_free(void* model) { delete static_cast<sentencepiece::SentencePieceProcessor*>(model); }

}  // extern "C"
