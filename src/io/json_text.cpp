#include "io/json_text.h"

#include <cstdint>
#include <set>
#include <vector>

#include "core/error.h"

namespace mt {

namespace {

// Decodes one UTF-8 code point at s[i]; returns its length, or 0 if malformed.
size_t utf8_decode(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  size_t n;
  uint32_t v;
  if (c < 0x80) {
    *cp = c;
    return 1;
  } else if (c >= 0xc2 && c <= 0xdf) {
    n = 2, v = c & 0x1fu;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3, v = c & 0x0fu;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4, v = c & 0x07u;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xc0) != 0x80) return 0;
    v = (v << 6) | (b(k) & 0x3fu);
  }
  const uint32_t min_for_len[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < min_for_len[n] || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  *cp = v;
  return n;
}

void append_u4(std::string& out, uint32_t u) {
  static const char* hex = "0123456789abcdef";
  out += "\\u";
  for (int sh = 12; sh >= 0; sh -= 4) out += hex[(u >> sh) & 0xf];
}

// The escapes serde_json and Python share; returns false if `c` needs no named escape.
bool append_named_escape(std::string& out, char c) {
  switch (c) {
    case '"': out += "\\\""; return true;
    case '\\': out += "\\\\"; return true;
    case '\n': out += "\\n"; return true;
    case '\r': out += "\\r"; return true;
    case '\t': out += "\\t"; return true;
    case '\b': out += "\\b"; return true;
    case '\f': out += "\\f"; return true;
    default: return false;
  }
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

}  // namespace

bool utf8_valid(std::string_view s) {
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_decode(s, i, &cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

nlohmann::ordered_json json_parse_strict(std::string_view text, std::string_view what, int max_depth) {
  using J = nlohmann::ordered_json;
  if (!utf8_valid(text)) {
    size_t bad = 0;
    uint32_t cp;
    for (size_t n; bad < text.size() && (n = utf8_decode(text, bad, &cp)) != 0;) bad += n;
    fail("{}: not valid UTF-8 (bad byte at offset {})", what, bad);
  }
  // One key set per open object: nlohmann silently keeps the last of duplicate keys, which
  // would let a hostile file say two things about one tensor.
  std::vector<std::set<std::string>> keys;
  auto cb = [&](int depth, J::parse_event_t ev, J& parsed) -> bool {
    using E = J::parse_event_t;
    if ((ev == E::object_start || ev == E::array_start) && depth >= max_depth)
      fail("{}: JSON nested deeper than {} levels", what, max_depth);
    if (ev == E::object_start) keys.emplace_back();
    if (ev == E::object_end && !keys.empty()) keys.pop_back();
    if (ev == E::key && !keys.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second) fail("{}: duplicate JSON key {}", what, json_quote_short(k));
    }
    return true;
  };
  try {
    return J::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {
    std::string msg = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix.
    if (auto p = msg.find("] "); p != std::string::npos && msg.rfind("[json.exception", 0) == 0)
      msg = msg.substr(p + 2);
    fail("{}: invalid JSON: {}", what, one_line(msg));
  }
}

std::string json_quote_serde(std::string_view s) {
  std::string out = "\"";
  out.reserve(s.size() + 2);
  for (char c : s) {
    if (append_named_escape(out, c)) continue;
    if (static_cast<unsigned char>(c) < 0x20)
      append_u4(out, static_cast<unsigned char>(c));
    else
      out += c;
  }
  return out + "\"";
}

std::string json_quote_python(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t n = utf8_decode(s, i, &cp);
    MT_CHECK(n != 0, "json_quote_python needs valid UTF-8 (bad byte at {})", i);
    i += n;
    if (cp < 0x80 && append_named_escape(out, static_cast<char>(cp))) continue;
    if (cp >= 0x20 && cp <= 0x7e) {
      out += static_cast<char>(cp);
    } else if (cp < 0x10000) {
      append_u4(out, cp);
    } else {
      const uint32_t v = cp - 0x10000;
      append_u4(out, 0xd800 + (v >> 10));
      append_u4(out, 0xdc00 + (v & 0x3ff));
    }
  }
  return out + "\"";
}

std::string json_quote_short(std::string_view s) {
  constexpr size_t kMax = 200;
  if (s.size() <= kMax) return json_quote_serde(s);
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) --cut;  // keep whole code points
  return json_quote_serde(s.substr(0, cut)) + "...";
}

}  // namespace mt
