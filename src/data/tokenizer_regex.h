// The pre-tokenizer regex: Oniguruma with the settings of the Rust `onig` crate that HF
// `tokenizers` uses (onig::Regex::new: ONIG_OPTION_NONE, ONIG_SYNTAX_DEFAULT, UTF-8).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mt {

struct ByteRange {
  size_t begin = 0;
  size_t end = 0;
};

class TokenizerRegex {
 public:
  // mt::Error "<where>: ..." when Oniguruma rejects the pattern. `batched` = false disables the
  // chained pattern below (tests compare the two).
  TokenizerRegex(std::string_view pattern, const std::string& where, bool batched = true);
  ~TokenizerRegex();
  TokenizerRegex(const TokenizerRegex&) = delete;
  TokenizerRegex& operator=(const TokenizerRegex&) = delete;

  // Appends the matches of `text` (valid UTF-8) in order, with onig's find_iter rules for empty
  // matches. Safe to call from several threads at once.
  void find_all(std::string_view text, std::vector<ByteRange>& out) const;

 private:
  // OnigRegex handles, kept out of the header (oniguruma.h defines UChar).
  void* regex_ = nullptr;
  // "(P)(P)?(P)?..." with kChain copies: one onig_search yields up to kChain consecutive matches.
  // Each onig_search call mallocs and copies its ~5 KB backtrack stack (Oniguruma 6.9.8
  // STACK_SAVE), which dominated the split; chaining pays that once per kChain pieces. Group g+1
  // is the leftmost-first match of P where group g ended, or unset when P cannot match there
  // (the optional groups always let the overall match succeed, so no group is ever re-chosen).
  // Only built when P has no capture groups and no \G.
  void* chain_ = nullptr;
  static constexpr int kChain = 16;
};

}  // namespace mt
