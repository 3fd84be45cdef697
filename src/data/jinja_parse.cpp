// Jinja lexer and parser: template text -> JinjaProgram. Whitespace handling follows jinja2's
// lexer with trim_blocks=True and lstrip_blocks=True (what Transformers uses); the expression
// grammar follows jinja2's parser (precedence: if-else < or < and < not < comparisons < + - <
// ~ < * / // % < ** < unary - + < filters/tests < postfix . [] ()).
#include <string>
#include <vector>

#include "core/error.h"
#include "data/jinja.h"
#include "data/jinja_ast.h"
#include "io/json_text.h"

namespace mt {
namespace {

constexpr int kMaxDepth = 200;  // nesting of expressions and blocks; keeps the C++ stack bounded

struct Tok {
  enum class K { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Str, Int, Float, Op, Eof };
  K k;
  std::string s;
  int line;
};

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

class Parser {
 public:
  Parser(std::vector<Tok> toks, std::string_view name) : t_(std::move(toks)), name_(name) {}

  JBody parse_template() {
    std::string found;
    JBody body = parse_until({}, found);
    return body;
  }

 private:
  using K = JExpr::Kind;

  [[noreturn]] void error(const std::string& msg) { fail("{} line {}: {}", name_, cur().line, msg); }
  const Tok& cur() const { return t_[p_]; }
  const Tok& peek(size_t ahead = 1) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  bool is_op(std::string_view o) const { return cur().k == Tok::K::Op && cur().s == o; }
  bool is_name(std::string_view n) const { return cur().k == Tok::K::Name && cur().s == n; }
  std::string describe(const Tok& k) const {
    switch (k.k) {
      case Tok::K::Eof: return "end of template";
      case Tok::K::VarEnd: return "'}}'";
      case Tok::K::BlockEnd: return "'%}'";
      case Tok::K::Data: return "template text";
      case Tok::K::Str: return "string literal";
      default: return "'" + k.s + "'";
    }
  }
  void expect_op(std::string_view o) {
    if (!is_op(o)) error(fmt::format("expected '{}', found {}", o, describe(cur())));
    ++p_;
  }
  void expect(Tok::K k, std::string_view what) {
    if (cur().k != k) error(fmt::format("expected {}, found {}", what, describe(cur())));
    ++p_;
  }
  std::string expect_name() {
    if (cur().k != Tok::K::Name) error(fmt::format("expected a name, found {}", describe(cur())));
    return t_[p_++].s;
  }
  void expect_block_end() { expect(Tok::K::BlockEnd, "'%}'"); }

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& pp) : p(pp) {
      if (++p.depth_ > kMaxDepth) p.error("template nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  static JExprPtr make(K kind, int line) {
    auto e = std::make_unique<JExpr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  static JExprPtr make2(K kind, int line, JExprPtr a, JExprPtr b, std::string name = "") {
    auto e = make(kind, line);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    e->name = std::move(name);
    return e;
  }

  JBody parse_until(std::initializer_list<std::string_view> stops, std::string& found) {
    DepthGuard g(*this);
    JBody body;
    for (;;) {
      const Tok& k = cur();
      if (k.k == Tok::K::Eof) {
        if (stops.size() != 0) error(fmt::format("unexpected end of template, expected '{{% {} %}}'", *(stops.end() - 1)));
        found.clear();
        return body;
      }
      if (k.k == Tok::K::Data) {
        JNode n;
        n.kind = JNode::Kind::Text;
        n.line = k.line;
        n.text = k.s;
        body.push_back(std::move(n));
        ++p_;
        continue;
      }
      if (k.k == Tok::K::VarBegin) {
        ++p_;
        JNode n;
        n.kind = JNode::Kind::Output;
        n.line = k.line;
        n.expr = parse_tuple_expr();
        expect(Tok::K::VarEnd, "'}}'");
        body.push_back(std::move(n));
        continue;
      }
      if (k.k != Tok::K::BlockBegin) error(fmt::format("unexpected {}", describe(k)));
      ++p_;
      if (cur().k != Tok::K::Name) error(fmt::format("expected a tag name, found {}", describe(cur())));
      for (std::string_view s : stops)
        if (cur().s == s) {
          found = t_[p_++].s;
          return body;
        }
      body.push_back(parse_statement());
    }
  }

  JNode parse_statement() {
    const Tok& k = cur();
    JNode n;
    n.line = k.line;
    std::string tag = t_[p_++].s;
    std::string found;
    if (tag == "if") {
      n.kind = JNode::Kind::If;
      n.conditions.push_back(parse_expr());
      expect_block_end();
      for (;;) {
        n.bodies.push_back(parse_until({"elif", "else", "endif"}, found));
        if (found == "elif") {
          n.conditions.push_back(parse_expr());
          expect_block_end();
          continue;
        }
        if (found == "else") {
          expect_block_end();
          n.bodies.push_back(parse_until({"endif"}, found));
        }
        break;
      }
      expect_block_end();
    } else if (tag == "for") {
      n.kind = JNode::Kind::For;
      bool paren = is_op("(");
      if (paren) ++p_;
      n.targets.push_back(expect_name());
      while (is_op(",")) {
        ++p_;
        n.targets.push_back(expect_name());
      }
      if (paren) expect_op(")");
      if (!is_name("in")) error(fmt::format("expected 'in', found {}", describe(cur())));
      ++p_;
      n.expr = parse_expr(false);
      if (is_name("if")) {
        ++p_;
        n.filter = parse_expr();
      }
      if (is_name("recursive")) error("recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      n.bodies.push_back(parse_until({"else", "endfor"}, found));
      --loop_depth_;
      if (found == "else") {
        expect_block_end();
        n.bodies.push_back(parse_until({"endfor"}, found));
      }
      expect_block_end();
    } else if (tag == "set") {
      n.targets.push_back(expect_name());
      if (is_op(".")) {
        ++p_;
        n.attr = expect_name();
      } else {
        while (is_op(",")) {
          ++p_;
          n.targets.push_back(expect_name());
        }
      }
      if (is_op("=")) {
        ++p_;
        n.kind = JNode::Kind::Set;
        n.expr = parse_tuple_expr();
        expect_block_end();
      } else {
        if (!n.attr.empty() || n.targets.size() != 1) error("a block {% set %} takes one plain name");
        n.kind = JNode::Kind::SetBlock;
        expect_block_end();
        n.bodies.push_back(parse_until({"endset"}, found));
        expect_block_end();
      }
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) error(fmt::format("'{}' outside of a for loop", tag));
      n.kind = tag == "break" ? JNode::Kind::Break : JNode::Kind::Continue;
      expect_block_end();
    } else {
      --p_;
      error(fmt::format("unsupported or unexpected tag '{}'", tag));
    }
    return n;
  }

  // An expression, or a bare tuple `a, b` (as jinja2 allows in {{ }} and set).
  JExprPtr parse_tuple_expr() {
    int line = cur().line;
    JExprPtr e = parse_expr();
    if (!is_op(",")) return e;
    auto tup = make(K::TupleLit, line);
    tup->args.push_back(std::move(e));
    while (is_op(",")) {
      ++p_;
      if (cur().k == Tok::K::VarEnd || cur().k == Tok::K::BlockEnd) break;
      tup->args.push_back(parse_expr());
    }
    return tup;
  }

  JExprPtr parse_expr(bool with_cond = true) {
    DepthGuard g(*this);
    JExprPtr e = parse_or();
    if (!with_cond) return e;
    while (is_name("if")) {
      int line = cur().line;
      ++p_;
      auto c = make(K::Cond, line);
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      if (is_name("else")) {
        ++p_;
        c->args.push_back(parse_expr());
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  JExprPtr parse_or() {
    JExprPtr l = parse_and();
    while (is_name("or")) {
      int line = cur().line;
      ++p_;
      l = make2(K::Or, line, std::move(l), parse_and());
    }
    return l;
  }

  JExprPtr parse_and() {
    JExprPtr l = parse_not();
    while (is_name("and")) {
      int line = cur().line;
      ++p_;
      l = make2(K::And, line, std::move(l), parse_not());
    }
    return l;
  }

  JExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      auto e = make(K::Not, cur().line);
      ++p_;
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  JExprPtr parse_compare() {
    JExprPtr l = parse_math1();
    bool compared = false;
    for (;;) {
      int line = cur().line;
      std::string op;
      if (cur().k == Tok::K::Op && (cur().s == "==" || cur().s == "!=" || cur().s == "<" || cur().s == ">" ||
                                    cur().s == "<=" || cur().s == ">=")) {
        op = cur().s;
        ++p_;
      } else if (is_name("in")) {
        op = "in";
        ++p_;
      } else if (is_name("not") && peek().k == Tok::K::Name && peek().s == "in") {
        op = "not in";
        p_ += 2;
      } else {
        return l;
      }
      if (compared) error("chained comparisons (a < b < c) are not supported");
      compared = true;
      l = make2(K::Binary, line, std::move(l), parse_math1(), op);
    }
  }

  JExprPtr parse_math1() {
    JExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      int line = cur().line;
      std::string op = t_[p_++].s;
      l = make2(K::Binary, line, std::move(l), parse_concat(), op);
    }
    return l;
  }

  JExprPtr parse_concat() {
    JExprPtr l = parse_math2();
    while (is_op("~")) {
      int line = cur().line;
      ++p_;
      l = make2(K::Binary, line, std::move(l), parse_math2(), "~");
    }
    return l;
  }

  JExprPtr parse_math2() {
    JExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      int line = cur().line;
      std::string op = t_[p_++].s;
      l = make2(K::Binary, line, std::move(l), parse_pow(), op);
    }
    return l;
  }

  JExprPtr parse_pow() {
    JExprPtr l = parse_unary();
    while (is_op("**")) {
      int line = cur().line;
      ++p_;
      l = make2(K::Binary, line, std::move(l), parse_unary(), "**");
    }
    return l;
  }

  JExprPtr parse_unary(bool with_filter = true) {
    DepthGuard g(*this);
    JExprPtr node;
    if (is_op("-") || is_op("+")) {
      node = make(is_op("-") ? K::Neg : K::Pos, cur().line);
      ++p_;
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  JExprPtr parse_primary() {
    const Tok& k = cur();
    int line = k.line;
    switch (k.k) {
      case Tok::K::Name: {
        ++p_;
        auto e = make(K::Literal, line);
        if (k.s == "true" || k.s == "True") e->value = JValue::boolean(true);
        else if (k.s == "false" || k.s == "False") e->value = JValue::boolean(false);
        else if (k.s == "none" || k.s == "None") e->value = JValue::none();
        else {
          e->kind = K::Name;
          e->name = k.s;
        }
        return e;
      }
      case Tok::K::Str: {
        std::string s;
        while (cur().k == Tok::K::Str) s += t_[p_++].s;  // adjacent literals concatenate
        auto e = make(K::Literal, line);
        e->value = JValue::string(std::move(s));
        return e;
      }
      case Tok::K::Int: {
        ++p_;
        auto e = make(K::Literal, line);
        try {
          e->value = JValue::integer(std::stoll(k.s));
        } catch (const std::exception&) {
          error(fmt::format("integer literal {} is out of range", k.s));
        }
        return e;
      }
      case Tok::K::Float: {
        ++p_;
        auto e = make(K::Literal, line);
        e->value = JValue::real(std::strtod(k.s.c_str(), nullptr));
        return e;
      }
      case Tok::K::Op:
        if (k.s == "(") {
          ++p_;
          if (is_op(")")) {
            ++p_;
            return make(K::TupleLit, line);
          }
          JExprPtr e = parse_expr();
          if (is_op(",")) {
            auto tup = make(K::TupleLit, line);
            tup->args.push_back(std::move(e));
            while (is_op(",")) {
              ++p_;
              if (is_op(")")) break;
              tup->args.push_back(parse_expr());
            }
            e = std::move(tup);
          }
          expect_op(")");
          return e;
        }
        if (k.s == "[") {
          ++p_;
          auto e = make(K::ListLit, line);
          while (!is_op("]")) {
            e->args.push_back(parse_expr());
            if (!is_op(",")) break;
            ++p_;
          }
          expect_op("]");
          return e;
        }
        if (k.s == "{") {
          ++p_;
          auto e = make(K::DictLit, line);
          while (!is_op("}")) {
            e->args.push_back(parse_expr());
            expect_op(":");
            e->args.push_back(parse_expr());
            if (!is_op(",")) break;
            ++p_;
          }
          expect_op("}");
          return e;
        }
        break;
      default: break;
    }
    error(fmt::format("unexpected {}", describe(k)));
  }

  JExprPtr parse_postfix(JExprPtr node) {
    for (;;) {
      int line = cur().line;
      if (is_op(".")) {
        ++p_;
        if (cur().k == Tok::K::Int) {
          auto idx = make(K::Literal, line);
          idx->value = JValue::integer(std::stoll(t_[p_++].s));
          node = make2(K::Item, line, std::move(node), std::move(idx));
        } else {
          auto e = make(K::Attr, line);
          e->name = expect_name();
          e->args.push_back(std::move(node));
          node = std::move(e);
        }
      } else if (is_op("[")) {
        ++p_;
        JExprPtr a[3];
        bool slice = false;
        if (!is_op(":")) a[0] = parse_expr();
        if (is_op(":")) {
          slice = true;
          ++p_;
          if (!is_op("]") && !is_op(":")) a[1] = parse_expr();
          if (is_op(":")) {
            ++p_;
            if (!is_op("]")) a[2] = parse_expr();
          }
        }
        expect_op("]");
        if (slice) {
          auto e = make(K::Slice, line);
          e->args.push_back(std::move(node));
          for (auto& x : a) e->args.push_back(std::move(x));
          node = std::move(e);
        } else {
          node = make2(K::Item, line, std::move(node), std::move(a[0]));
        }
      } else if (is_op("(")) {
        node = parse_call(std::move(node), K::Call, "");
      } else {
        return node;
      }
    }
  }

  // Arguments of a call, filter or test: `(a, b, key=value)`; `node` becomes args[0].
  JExprPtr parse_call(JExprPtr node, K kind, std::string name) {
    auto e = make(kind, cur().line);
    e->name = std::move(name);
    e->args.push_back(std::move(node));
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported");
      if (cur().k == Tok::K::Name && peek().k == Tok::K::Op && peek().s == "=") {
        std::string key = t_[p_].s;
        p_ += 2;
        e->kwargs.emplace_back(key, parse_expr());
      } else {
        if (!e->kwargs.empty()) error("positional argument after keyword argument");
        e->args.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      ++p_;
    }
    expect_op(")");
    return e;
  }

  JExprPtr parse_filter_expr(JExprPtr node) {
    for (;;) {
      int line = cur().line;
      if (is_op("|")) {
        ++p_;
        std::string name = expect_name();
        while (is_op(".")) {
          ++p_;
          name += "." + expect_name();
        }
        if (is_op("(")) {
          node = parse_call(std::move(node), K::Filter, name);
        } else {
          auto e = make(K::Filter, line);
          e->name = name;
          e->args.push_back(std::move(node));
          node = std::move(e);
        }
      } else if (is_name("is")) {
        ++p_;
        bool negated = false;
        if (is_name("not")) {
          ++p_;
          negated = true;
        }
        std::string name = expect_name();
        JExprPtr e;
        if (is_op("(")) {
          e = parse_call(std::move(node), K::Test, name);
        } else {
          e = make(K::Test, line);
          e->name = name;
          e->args.push_back(std::move(node));
          bool starts_primary = cur().k == Tok::K::Name || cur().k == Tok::K::Str || cur().k == Tok::K::Int ||
                                cur().k == Tok::K::Float || is_op("[") || is_op("{");
          // NOTE: jinja2 excludes else/or/and; `if` too, so `x is defined if c else d` works.
          if (starts_primary && !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if")) {
            if (is_name("is")) error("you cannot chain multiple tests with 'is'");
            e->args.push_back(parse_postfix(parse_primary()));
          }
        }
        e->negated = negated;
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node), K::Call, "");
      } else {
        return node;
      }
    }
  }

  std::vector<Tok> t_;
  std::string_view name_;
  size_t p_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

JinjaTemplate jinja_compile(std::string_view text, std::string_view name) {
  if (!utf8_valid(text)) fail("{}: template text is not valid UTF-8", name);
  auto program = std::make_shared<JinjaProgram>();
  program->body = Parser(Lexer(text, name).run(), name).parse_template();
  return JinjaTemplate{std::move(program), std::string(name)};
}

}  // namespace mt
