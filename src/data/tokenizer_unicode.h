// UTF-8 repair and NFC for the tokenizer: the two places where HF relies on Rust's string type
// (String::from_utf8_lossy) and on the unicode-normalization crate.
#pragma once
#include <string>
#include <string_view>

namespace mt {

// True when `s` is well-formed UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool utf8_is_valid(std::string_view s);

// Every ill-formed sequence becomes U+FFFD, one per maximal subpart (Unicode §3.9 "U+FFFD
// substitution of maximal subparts"), exactly as Rust's String::from_utf8_lossy does.
std::string utf8_lossy(std::string_view s);

// Unicode NFC of valid UTF-8 (utf8proc). Runs of ASCII pass through untouched: ASCII never
// decomposes, is a starter, and is never the second half of a canonical composition.
std::string nfc_normalize(std::string_view s);

// Length in bytes of the UTF-8 sequence that starts with lead byte `b` (1 for a stray byte).
inline int utf8_seq_len(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

}  // namespace mt
