// Caption tokens as upstream makes them, for a TorchScript text encoder that takes token ids
// (text_encoder.tokenizer_path, a SentencePiece model such as Gemma's or T5's tokenizer.model):
// Hugging Face's tokenizer(texts, max_length, padding="max_length", truncation=True) for that
// family (Gemma: BOS first; T5: EOS last; padded on the right), and upstream train.py's CHI
// prompt and token selection around it. Never includes torch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace sana::model {

struct TokenBatch {
  int64_t rows = 0, length = 0;
  std::vector<int64_t> ids;   // rows x length, row-major
  std::vector<int64_t> mask;  // 1 for a real token, 0 for padding
};

class CaptionTokenizer {
 public:
  // Loads the SentencePiece model at `path` (through libsana_spm.so, beside the executable);
  // `encoder_name` (upstream's text_encoder_name) picks the special tokens. Throws
  // sana::UsageError naming text_encoder.tokenizer_path.
  CaptionTokenizer(const std::string& path, const std::string& encoder_name);
  ~CaptionTokenizer();
  CaptionTokenizer(CaptionTokenizer&&) noexcept;

  // The ids of `text` with its special tokens, untruncated (len(tokenizer.encode(text))).
  std::vector<int64_t> encode(const std::string& text) const;
  // Every text as exactly `length` ids: truncated at the end (the special tokens kept),
  // padded on the right with the pad id.
  TokenBatch batch(const std::vector<std::string>& texts, int64_t length) const;

 private:
  struct Module;  // the opened libsana_spm.so and the loaded model
  std::unique_ptr<Module> spm_;
  bool bos_ = false, eos_ = false;
  int64_t pad_ = 0;
};

// Upstream train.py's captions: with a CHI prompt (any encoder but T5) each caption becomes the
// prompt's lines joined by "\n" followed by the caption, tokenized to n + model_max_length - 2
// tokens (n: the prompt's own token count, special tokens included), and the encoder's output
// keeps token 0 and the last model_max_length - 1. Without one: model_max_length tokens, all kept.
struct CaptionPlan {
  std::vector<std::string> texts;
  int64_t length = 0;          // tokens per text
  std::vector<int64_t> keep;   // the token positions kept, model_max_length of them
};
CaptionPlan plan_captions(const std::vector<std::string>& captions, const std::vector<std::string>& chi_prompt,
                          const std::string& encoder_name, int64_t model_max_length,
                          const std::function<int64_t(const std::string&)>& count_tokens);

// Token 0 and the last `keep - 1` of `length` tokens (upstream's select_index).
std::vector<int64_t> select_index(int64_t length, int64_t keep);

}  // namespace sana::model
