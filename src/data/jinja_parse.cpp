// Jinja parser: tokens (jinja_lex.cpp) -> JinjaProgram. The expression grammar follows jinja2's
// parser (precedence: if-else < or < and < not < comparisons < + - <
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

using Tok = jinja::Token;

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
    } else if (tag == "macro") {
      // {% macro name(a, b=default) %}...{% endmacro %}: defaults are evaluated at each call, in the
      // macro's own scope (so `c=a` sees the argument a), as jinja2 does.
      n.kind = JNode::Kind::Macro;
      n.attr = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (is_op("*") || is_op("**")) error("*args and **kwargs in macro parameters are not supported");
        std::string param = expect_name();
        for (const auto& p : n.targets)
          if (p == param) error(fmt::format("duplicate parameter '{}' in macro '{}'", param, n.attr));
        n.targets.push_back(std::move(param));
        if (is_op("=")) {
          ++p_;
          n.defaults.push_back(parse_expr());
        } else {
          if (!n.defaults.empty() && n.defaults.back()) error("non-default parameter follows a default parameter");
          n.defaults.push_back(nullptr);
        }
        if (!is_op(",")) break;
        ++p_;
      }
      expect_op(")");
      expect_block_end();
      const int outer_loops = loop_depth_;
      loop_depth_ = 0;  // break/continue cannot leave a macro
      n.bodies.push_back(parse_until({"endmacro"}, found));
      loop_depth_ = outer_loops;
      expect_block_end();
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
          name += '.';
          name += expect_name();  // NOTE: not "." + ..., which trips GCC 12's false -Wrestrict
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
  program->body = Parser(jinja::lex(text, name), name).parse_template();
  return JinjaTemplate{std::move(program), std::string(name)};
}

}  // namespace mt
