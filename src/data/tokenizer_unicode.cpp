#include "data/tokenizer_unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace mt {

namespace {

// Length of the valid UTF-8 sequence at s[i], or -(bytes of the maximal invalid subpart).
int utf8_step(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // no overlongs
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;  // 0x80..0xC1, 0xF5..0xFF never start a sequence
  }
  int got = 1;
  for (; got < need; ++got) {
    if (i + got >= s.size()) return -got;
    const auto b = static_cast<unsigned char>(s[i + got]);
    const unsigned char l = got == 1 ? lo : 0x80, h = got == 1 ? hi : 0xBF;
    if (b < l || b > h) return -got;
  }
  return need;
}

}  // namespace

bool utf8_is_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const int n = utf8_step(s, i);
    if (n < 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    const int n = utf8_step(s, i);
    if (n > 0) {
      out.append(s.data() + i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else {
      out += "\xEF\xBF\xBD";
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

namespace {

void nfc_append(std::string_view chunk, std::string& out) {
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(chunk.data()), static_cast<utf8proc_ssize_t>(chunk.size()),
                   &dst, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> keep(dst, &std::free);
  if (n < 0) fail("NFC normalisation failed: {}", utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
}

}  // namespace

std::string nfc_normalize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size() && static_cast<unsigned char>(s[j]) < 0x80) ++j;
    if (j == s.size()) {
      out.append(s.data() + i, j - i);
      break;
    }
    // s[j] starts a non-ASCII run; the ASCII character before it may compose with what follows.
    size_t start = j > i ? j - 1 : j;
    out.append(s.data() + i, start - i);
    size_t k = j;
    while (k < s.size() && static_cast<unsigned char>(s[k]) >= 0x80) ++k;
    nfc_append(s.substr(start, k - start), out);
    i = k;
  }
  return out;
}

}  // namespace mt
