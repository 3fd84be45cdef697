// A tokenizer for the CLI tests of checkpoints that come without one.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace mt::test {

// A byte-level tokenizer.json (GPT-2's byte map, token id = byte value, no merges, no added tokens): "abc" is ids
// 97..99, inside the tiny fixtures' vocabulary of 128 (DeepSeek-V3, Nemotron-H).
inline std::string byte_tokenizer_json() {
  auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) return s += static_cast<char>(cp), s;
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
    return s;
  };
  nlohmann::json vocab = nlohmann::json::object();
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    vocab[utf8(printable ? b : next++)] = b;
  }
  const nlohmann::json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}};
  return nlohmann::json{{"version", "1.0"},
                        {"added_tokens", nlohmann::json::array()},
                        {"normalizer", nullptr},
                        {"pre_tokenizer", byte_level},
                        {"post_processor", byte_level},
                        {"decoder", byte_level},
                        {"model",
                         {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"byte_fallback", false},
                          {"ignore_merges", false}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}}
      .dump();
}

}  // namespace mt::test
