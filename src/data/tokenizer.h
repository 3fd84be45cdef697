// A Hugging Face `tokenizer.json` byte-level BPE tokenizer that reproduces HF `tokenizers` 0.23
// (encode with add_special_tokens=false, decode with skip_special_tokens as given).
// Supported: Qwen2/Qwen3, DeepSeek-V3 and gpt-oss style files (hf-numerics.md §9); anything the
// loader does not understand is refused with an mt::Error naming the file and the field.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

struct TokenizerImpl;

class Tokenizer {
 public:
  // `path` is a tokenizer.json file or a directory holding one.
  static Tokenizer from_file(const std::string& path);
  // Same, from the JSON text itself; `source` names it in error messages.
  static Tokenizer from_json_text(std::string_view json_text, const std::string& source);

  // Thread-safe. Invalid UTF-8 bytes in `text` are replaced by U+FFFD first (as Rust's
  // String::from_utf8_lossy does), since HF only ever sees valid strings.
  std::vector<int32_t> encode(std::string_view text) const;
  // Ids that name no token are skipped, as HF does. Invalid UTF-8 in the result is replaced by U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int64_t vocab_size() const;  // model vocabulary plus added tokens (HF get_vocab_size(True))
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const std::string& id_to_token(int32_t id) const;  // mt::Error for an id that names no token
  bool is_special(int32_t id) const;                  // an added token marked "special"

 private:
  Tokenizer() = default;  // only the loaders make one, so impl_ is never null
  std::shared_ptr<const TokenizerImpl> impl_;
};

}  // namespace mt
