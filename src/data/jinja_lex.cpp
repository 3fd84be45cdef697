// Jinja lexer: template text -> tokens. Whitespace handling follows jinja2's lexer with
// trim_blocks=True and lstrip_blocks=True (what Transformers uses): a block or comment tag eats
// one newline after it; spaces between a line start and a block/comment tag are dropped;
// `-` strips all whitespace on that side, `+` keeps the line's leading spaces.
#include <string>
#include <vector>

#include "core/error.h"
#include "data/jinja_ast.h"
#include "io/json_text.h"

namespace mt::jinja {
namespace {

using Tok = Token;

bool ws_at(const std::string& s, size_t pos, size_t* len) {
  std::u32string one = utf8_decode(std::string_view(s).substr(pos, 4));
  if (one.empty() || !py_isspace(one[0])) return false;
  *len = utf8_encode(one.substr(0, 1)).size();
  return true;
}

class Lexer {
 public:
  Lexer(std::string_view text, std::string_view name) : name_(name) {
    // jinja2 normalises newlines to "\n" and drops one trailing newline (keep_trailing_newline=False).
    src_.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\r') {
        src_ += '\n';
        if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
      } else {
        src_ += text[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Tok> run() {
    bool line_starting = true;
    const size_t n = src_.size();
    while (pos_ < n) {
      size_t k = pos_;
      for (;; ++k) {
        k = src_.find('{', k);
        if (k == std::string::npos || k + 1 >= n) {
          k = std::string::npos;
          break;
        }
        char c = src_[k + 1];
        if (c == '{' || c == '%' || c == '#') break;
      }
      if (k == std::string::npos) {
        out_.push_back({Tok::K::Data, src_.substr(pos_), line_});
        break;
      }
      std::string text = src_.substr(pos_, k - pos_);
      const char kind = src_[k + 1];
      const char sign = k + 2 < n ? src_[k + 2] : '\0';
      int text_lines = count_newlines(text);
      if (sign == '-') {
        text = py_strip(text, nullptr, false, true);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop spaces between the line start and a block/comment tag.
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            py_strip(std::string_view(text).substr(l_pos), nullptr, true, true).empty())
          text.resize(l_pos);
      }
      if (!text.empty()) out_.push_back({Tok::K::Data, text, line_});
      line_ += text_lines;
      pos_ = k + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        lex_comment();
      } else {
        lex_tag(kind == '{');
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    out_.push_back({Tok::K::Eof, "", line_});
    return std::move(out_);
  }

 private:
  [[noreturn]] void error(const std::string& msg) { fail("{} line {}: {}", name_, line_, msg); }

  static int count_newlines(std::string_view s) {
    int c = 0;
    for (char ch : s) c += ch == '\n';
    return c;
  }

  void skip_ws() {
    size_t len = 0;
    while (pos_ < src_.size() && ws_at(src_, pos_, &len)) {
      if (src_[pos_] == '\n') ++line_;
      pos_ += len;
    }
  }

  bool at(std::string_view s) const { return src_.compare(pos_, s.size(), s) == 0; }

  void lex_comment() {
    size_t e = src_.find("#}", pos_);
    if (e == std::string::npos) error("unterminated comment '{#'");
    bool strip = e > pos_ && src_[e - 1] == '-';
    line_ += count_newlines(std::string_view(src_).substr(pos_, e - pos_));
    pos_ = e + 2;
    if (strip) {
      skip_ws();
    } else if (pos_ < src_.size() && src_[pos_] == '\n') {  // trim_blocks
      ++pos_;
      ++line_;
    }
  }

  void lex_tag(bool variable) {
    out_.push_back({variable ? Tok::K::VarBegin : Tok::K::BlockBegin, "", line_});
    int depth = 0;
    for (;;) {
      while (pos_ < src_.size() && (src_[pos_] == ' ' || src_[pos_] == '\t' || src_[pos_] == '\n')) {
        if (src_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= src_.size()) error(variable ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      if (depth == 0) {
        const char* end = variable ? "}}" : "%}";
        if (src_[pos_] == '-' && at(std::string("-") + end)) {
          pos_ += 3;
          out_.push_back({variable ? Tok::K::VarEnd : Tok::K::BlockEnd, "", line_});
          skip_ws();
          return;
        }
        if (at(end)) {
          pos_ += 2;
          out_.push_back({variable ? Tok::K::VarEnd : Tok::K::BlockEnd, "", line_});
          if (!variable && pos_ < src_.size() && src_[pos_] == '\n') {  // trim_blocks
            ++pos_;
            ++line_;
          }
          return;
        }
      }
      lex_token(depth);
    }
  }

  void lex_token(int& depth) {
    const char c = src_[pos_];
    auto is_digit = [](char ch) { return ch >= '0' && ch <= '9'; };
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t b = pos_;
      while (pos_ < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) ++pos_;
      out_.push_back({Tok::K::Name, src_.substr(b, pos_ - b), line_});
      return;
    }
    if (is_digit(c)) {
      size_t b = pos_;
      bool is_float = false;
      auto digits = [&] {
        while (pos_ < src_.size() && (is_digit(src_[pos_]) || src_[pos_] == '_')) ++pos_;
      };
      digits();
      if (pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
        ++pos_;
        digits();
        is_float = true;
      }
      if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
        size_t save = pos_++;
        if (pos_ < src_.size() && (src_[pos_] == '+' || src_[pos_] == '-')) ++pos_;
        if (pos_ < src_.size() && is_digit(src_[pos_])) {
          digits();
          is_float = true;
        } else {
          pos_ = save;
        }
      }
      std::string num;
      for (size_t i = b; i < pos_; ++i)
        if (src_[i] != '_') num += src_[i];
      out_.push_back({is_float ? Tok::K::Float : Tok::K::Int, num, line_});
      return;
    }
    if (c == '\'' || c == '"') {
      out_.push_back({Tok::K::Str, lex_string(c), line_});
      return;
    }
    static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "[", "]", "(",
                                ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"};
    for (const char* op : ops) {
      if (at(op)) {
        std::string o = op;
        if (o == "(" || o == "[" || o == "{") ++depth;
        if (o == ")" || o == "]" || o == "}") {
          if (depth == 0) error(fmt::format("unexpected '{}'", o));
          --depth;
        }
        pos_ += o.size();
        out_.push_back({Tok::K::Op, o, line_});
        return;
      }
    }
    error(fmt::format("unexpected character {}", json_quote_short(std::string(1, c))));
  }

  // Python string-literal escapes (jinja2 decodes with "unicode-escape").
  std::string lex_string(char quote) {
    const int start_line = line_;
    ++pos_;
    std::string out;
    auto hex = [&](int ndig) -> uint32_t {
      uint32_t v = 0;
      for (int i = 0; i < ndig; ++i) {
        if (pos_ >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[pos_])))
          error("truncated \\x, \\u or \\U escape in string literal");
        char h = src_[pos_++];
        v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      return v;
    };
    for (;;) {
      if (pos_ >= src_.size()) {
        line_ = start_line;
        error("unterminated string literal");
      }
      char c = src_[pos_];
      if (c == quote) {
        ++pos_;
        return out;
      }
      if (c == '\n') ++line_;
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      if (pos_ + 1 >= src_.size()) continue;  // reported as unterminated above
      char e = src_[pos_ + 1];
      pos_ += 2;
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '\n': ++line_; break;  // line continuation
        case 'x': out += utf8_encode(std::u32string(1, static_cast<char32_t>(hex(2)))); break;
        case 'u':
        case 'U': {
          uint32_t cp = hex(e == 'u' ? 4 : 8);
          if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) error("invalid code point escape in string literal");
          out += utf8_encode(std::u32string(1, static_cast<char32_t>(cp)));
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++i)
              v = v * 8 + static_cast<uint32_t>(src_[pos_++] - '0');
            out += utf8_encode(std::u32string(1, static_cast<char32_t>(v)));
          } else {  // unknown escapes stay as written, as in Python
            out += '\\';
            --pos_;
          }
      }
    }
  }

  std::string src_;
  std::string_view name_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Tok> out_;
};

}  // namespace

std::vector<Token> lex(std::string_view text, std::string_view name) { return Lexer(text, name).run(); }

}  // namespace mt::jinja
