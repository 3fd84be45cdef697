// JSON text as the checkpoint formats need it: strict parsing of hostile headers and
// byte-exact string escaping in the two styles that producers use (Rust serde_json for
// safetensors headers, Python json.dumps(ensure_ascii=True) for index files).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace mt {

// True if `s` is well-formed UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool utf8_valid(std::string_view s);

// Parses `text` as JSON. Rejects (mt::Error naming `what`) invalid UTF-8, syntax errors,
// duplicate object keys and nesting deeper than `max_depth`. Object keys keep file order.
nlohmann::ordered_json json_parse_strict(std::string_view text, std::string_view what, int max_depth = 16);

// serde_json::to_string of a string, quotes included: \" \\ \n \r \t \b \f, other control
// characters as \u00xx, everything else (non-ASCII UTF-8, DEL) raw.
std::string json_quote_serde(std::string_view s);

// Python json.dumps(s) (ensure_ascii=True), quotes included: like serde for the named
// escapes, but every byte outside ' '..'~' is \uxxxx (UTF-16 surrogate pairs above U+FFFF).
// `s` must be valid UTF-8.
std::string json_quote_python(std::string_view s);

// A name quoted for an error message: serde-escaped (so it stays on one line), cut at 200 bytes.
std::string json_quote_short(std::string_view s);

}  // namespace mt
