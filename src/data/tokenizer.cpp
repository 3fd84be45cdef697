// Encode and decode with HF tokenizers' order of operations (tokenizer/mod.rs encode_single_sequence):
// added tokens on the raw text -> normalizer -> added tokens marked normalized -> pre-tokenizer
// splits -> byte-level BPE per piece. Decode runs the ByteLevel decoder over all tokens at once.
#include "data/tokenizer.h"

#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/tokenizer_impl.h"
#include "data/tokenizer_unicode.h"

namespace mt {

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail("cannot open tokenizer file {}", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("cannot read tokenizer file {}", p.string());
  return ss.str();
}

// Split every piece with `re`, Isolated: each match and each gap between matches is a piece.
void split_isolated(const TokenizerRegex& re, std::vector<std::string_view>& pieces, std::vector<ByteRange>& ranges) {
  std::vector<std::string_view> out;
  out.reserve(pieces.size() * 2);
  for (std::string_view p : pieces) {
    ranges.clear();
    re.find_all(p, ranges);
    size_t prev = 0;
    for (const ByteRange& m : ranges) {
      if (m.begin > prev) out.push_back(p.substr(prev, m.begin - prev));
      if (m.end > m.begin) out.push_back(p.substr(m.begin, m.end - m.begin));
      prev = m.end;
    }
    if (prev < p.size()) out.push_back(p.substr(prev));
  }
  pieces.swap(out);
}

void encode_segment(const TokenizerImpl& t, std::string_view text, std::vector<int32_t>& ids) {
  if (text.empty()) return;
  std::vector<std::string_view> pieces{text};
  std::vector<ByteRange> ranges;
  for (const auto& re : t.splits) split_isolated(*re, pieces, ranges);
  std::deque<std::string> prefixed;  // owns pieces that ByteLevel(add_prefix_space) extended
  if (t.byte_level_prefix_space) {
    for (std::string_view& p : pieces) {
      if (p.empty() || p[0] != ' ') {
        std::string& s = prefixed.emplace_back(1, ' ');
        s.append(p);
        p = s;
      }
    }
  }
  if (t.byte_level_regex) split_isolated(*t.byte_level_regex, pieces, ranges);
  for (std::string_view p : pieces) t.model->encode_piece(p, ids);
}

// Splits `text` at the matches of `m`: added-token ids go straight to `ids`, the text between
// them to `rest`.
template <typename Rest>
void split_added(const AddedTokenMatcher& m, std::string_view text, std::vector<int32_t>& ids, Rest&& rest) {
  if (m.empty()) {
    rest(text);
    return;
  }
  std::vector<AddedTokenMatch> matches;
  m.find_all(text, matches);
  size_t prev = 0;
  for (const AddedTokenMatch& a : matches) {
    if (a.begin > prev) rest(text.substr(prev, a.begin - prev));
    ids.push_back(a.id);
    prev = a.end;
  }
  if (prev < text.size()) rest(text.substr(prev));
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "tokenizer.json";
  if (!std::filesystem::exists(p)) fail("tokenizer file {} does not exist", p.string());
  return from_json_text(read_file(p), p.string());
}

Tokenizer Tokenizer::from_json_text(std::string_view json_text, const std::string& source) {
  Tokenizer t;
  t.impl_ = tokenizer_load(json_text, source);
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const TokenizerImpl& t = *impl_;
  std::string repaired;
  if (!utf8_is_valid(text)) {
    repaired = utf8_lossy(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  split_added(t.raw_matcher, text, ids, [&](std::string_view segment) {
    if (!t.nfc) {
      split_added(t.normalized_matcher, segment, ids, [&](std::string_view s) { encode_segment(t, s, ids); });
      return;
    }
    const std::string normalized = nfc_normalize(segment);
    split_added(t.normalized_matcher, normalized, ids, [&](std::string_view s) { encode_segment(t, s, ids); });
  });
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const TokenizerImpl& t = *impl_;
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    const std::string* tok = nullptr;
    if (auto it = t.added.find(id); it != t.added.end()) {
      tok = &it->second.decoded;
    } else {
      tok = t.model->id_to_token(id);
    }
    if (!tok) continue;  // HF skips ids that name no token
    if (skip_special_tokens && t.special_contents.contains(*tok)) continue;
    // ByteLevel decoder: a token made only of byte stand-ins becomes those bytes; any other
    // token (e.g. "<｜end▁of▁sentence｜>") is copied as it is.
    const size_t start = bytes.size();
    bool all_mapped = true;
    for (size_t i = 0; i < tok->size();) {
      const auto b0 = static_cast<unsigned char>((*tok)[i]);
      const int n = utf8_seq_len(b0);
      uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1Fu) : (b0 & 0x0Fu);
      for (int k = 1; k < n && i + k < tok->size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>((*tok)[i + k]) & 0x3Fu);
      const int byte = n <= 2 ? byte_level_byte_of(cp) : -1;
      if (byte < 0) {
        all_mapped = false;
        break;
      }
      bytes += static_cast<char>(byte);
      i += static_cast<size_t>(n);
    }
    if (!all_mapped) {
      bytes.resize(start);
      bytes += *tok;
    }
  }
  return utf8_lossy(bytes);
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) return it->second;
  return impl_->model->token_to_id(token);
}

const std::string& Tokenizer::id_to_token(int32_t id) const {
  if (auto it = impl_->added.find(id); it != impl_->added.end()) return it->second.decoded;
  if (const std::string* tok = impl_->model->id_to_token(id)) return *tok;
  fail("{}: no token has id {} (vocab_size {})", impl_->source, id, impl_->vocab_size);
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added.find(id);
  return it != impl_->added.end() && it->second.special;
}

}  // namespace mt
