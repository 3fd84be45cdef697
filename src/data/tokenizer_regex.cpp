#include "data/tokenizer_regex.h"

#define ONIG_ESCAPE_UCHAR_COLLISION
#include <oniguruma.h>

#include <memory>
#include <mutex>

#include "core/error.h"
#include "data/tokenizer_unicode.h"

namespace mt {

namespace {

void onig_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[1] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

struct RegionFree {
  void operator()(OnigRegion* r) const { onig_region_free(r, 1); }
};

}  // namespace

namespace {

OnigRegex compile(std::string_view pattern, const std::string& where) {
  onig_init_once();
  OnigRegex reg = nullptr;
  OnigErrorInfo einfo;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int r = onig_new(&reg, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &einfo);
  if (r != ONIG_NORMAL) {
    OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(msg, r, &einfo);
    fail("{}: invalid regex: {}", where, reinterpret_cast<const char*>(msg));
  }
  return reg;
}

[[noreturn]] void search_failed(int r) {
  OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
  onig_error_code_to_str(msg, r);
  fail("tokenizer regex search failed: {}", reinterpret_cast<const char*>(msg));
}

}  // namespace

TokenizerRegex::TokenizerRegex(std::string_view pattern, const std::string& where, bool batched) {
  OnigRegex single = compile(pattern, where);
  regex_ = single;
  const bool chainable = onig_number_of_captures(single) == 0 && pattern.find("\\G") == std::string_view::npos &&
                         pattern.find("(?x") == std::string_view::npos;
  if (batched && chainable) {
    std::string chain;
    for (int i = 0; i < kChain; ++i) {
      chain += '(';
      chain += pattern;
      chain += i == 0 ? ")" : ")?";
    }
    chain_ = compile(chain, where);
  }
}

TokenizerRegex::~TokenizerRegex() {
  if (regex_) onig_free(static_cast<OnigRegex>(regex_));
  if (chain_) onig_free(static_cast<OnigRegex>(chain_));
}

void TokenizerRegex::find_all(std::string_view text, std::vector<ByteRange>& out) const {
  auto reg = static_cast<OnigRegex>(chain_ ? chain_ : regex_);
  // One region per thread, reused: onig_search grows it to the group count as needed.
  thread_local std::unique_ptr<OnigRegion, RegionFree> region(onig_region_new());
  if (!region) fail("tokenizer regex: out of memory");
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = str + text.size();
  const int groups = chain_ ? kChain : 0;
  // As onig::FindMatches: an empty match right after a non-empty one is skipped, and after an
  // empty match the search resumes one character further on.
  size_t last_end = 0;
  bool skip_next_empty = false;
  while (last_end <= text.size()) {
    onig_region_clear(region.get());
    const int r = onig_search(reg, str, end, str + last_end, end, region.get(), ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) break;
    if (r < 0) search_failed(r);
    // Consecutive non-empty matches from the chain; an empty or missing one ends the run and is
    // left to the next (single-match) round, where the rules below apply to it.
    int g = groups > 0 ? 1 : 0;
    bool took = false;
    for (; g <= groups && g > 0; ++g) {
      const auto b = region->beg[g], e = region->end[g];
      if (b < 0 || b == e) break;
      out.push_back({static_cast<size_t>(b), static_cast<size_t>(e)});
      last_end = static_cast<size_t>(e);
      skip_next_empty = true;
      took = true;
    }
    if (took) continue;
    const auto s = static_cast<size_t>(region->beg[0]), e = static_cast<size_t>(groups > 0 ? region->end[1] : region->end[0]);
    last_end = e;
    if (s == e) {
      last_end += e < text.size() ? static_cast<size_t>(utf8_seq_len(str[e])) : 1;
      if (skip_next_empty) {
        skip_next_empty = false;
        continue;
      }
    } else {
      skip_next_empty = true;
    }
    out.push_back({s, e});
  }
}

}  // namespace mt
