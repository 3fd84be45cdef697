// Internal state of mt::Tokenizer, shared by the loader (tokenizer_load.cpp) and the
// encode/decode paths (tokenizer.cpp). Not part of the public API.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "data/tokenizer_added_tokens.h"
#include "data/tokenizer_bpe.h"
#include "data/tokenizer_regex.h"

namespace mt {

struct AddedToken {
  std::string content;
  std::string decoded;  // what decode() sees: the normalised content for normalized tokens (HF)
  bool special = false;
  bool normalized = false;
};

struct TokenizerImpl {
  std::string source;  // the file, for messages
  std::unique_ptr<BpeModel> model;
  bool nfc = false;  // normalizer: NFC or nothing
  // pre_tokenizer: Split(Regex, Isolated) stages in order, then ByteLevel.
  std::vector<std::unique_ptr<TokenizerRegex>> splits;
  bool byte_level_prefix_space = false;
  std::unique_ptr<TokenizerRegex> byte_level_regex;  // set when ByteLevel.use_regex is true
  // added_tokens: matched on the raw text (normalized=false) or after normalisation (normalized=true)
  AddedTokenMatcher raw_matcher;
  AddedTokenMatcher normalized_matcher;
  std::unordered_map<int32_t, AddedToken> added;
  TokenIdMap added_ids;  // content -> id
  std::unordered_set<std::string, StringHash, std::equal_to<>> special_contents;
  int64_t vocab_size = 0;
};

// Parses and validates a tokenizer.json document; `source` names it in every error.
std::shared_ptr<const TokenizerImpl> tokenizer_load(std::string_view json_text, const std::string& source);

}  // namespace mt
