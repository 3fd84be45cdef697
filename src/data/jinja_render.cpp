// Jinja evaluator: walks a JinjaProgram with Python/jinja2 semantics (Undefined for missing
// names, keys and indexes; per-iteration scopes in for loops; namespace() for state that must
// outlive a loop; macros that see their arguments and the template's top level), plus the
// filters, tests, globals and str/dict methods chat templates use.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "core/error.h"
#include "data/jinja.h"
#include "data/jinja_ast.h"
#include "data/jinja_builtins.h"

namespace mt {
namespace {

using namespace jinja;
using K = JValue::Kind;

constexpr int kMaxMacroDepth = 100;  // nested macro calls; keeps the C++ stack bounded

class Renderer {
 public:
  Renderer(const nlohmann::ordered_json& vars, const JinjaEnv& env) : env_(env) {
    scopes_.emplace_back();
    for (const char* g : {"namespace", "range", "raise_exception", "dict", "strftime_now"})
      scopes_.back()[g] = JValue::function(g);
    scopes_.emplace_back();
    for (const auto& [k, v] : vars.items()) scopes_.back()[k] = jvalue_from_json(v);
  }

  int line() const { return line_; }

  enum class Flow { Normal, Break, Continue };

  Flow exec(const JBody& body, std::string& out) {
    for (const JNode& n : body) {
      line_ = n.line;
      switch (n.kind) {
        case JNode::Kind::Text: out += n.text; break;
        case JNode::Kind::Output: out += jvalue_str(eval(*n.expr)); break;
        case JNode::Kind::If: {
          size_t i = 0;
          for (; i < n.conditions.size(); ++i)
            if (jvalue_truthy(eval(*n.conditions[i]))) break;
          if (i < n.bodies.size()) {
            Flow f = exec(n.bodies[i], out);
            if (f != Flow::Normal) return f;
          }
          break;
        }
        case JNode::Kind::For: exec_for(n, out); break;
        case JNode::Kind::Set: {
          JValue v = eval(*n.expr);
          line_ = n.line;
          if (!n.attr.empty()) {
            JValue ns = lookup(n.targets[0]);
            if (!ns.is(K::Namespace)) fail("cannot assign attribute on non-namespace object '{}'", n.targets[0]);
            ns.dict->set(n.attr, std::move(v));
          } else {
            assign(n.targets, std::move(v));
          }
          break;
        }
        case JNode::Kind::SetBlock: {
          std::string captured;
          exec(n.bodies[0], captured);
          scopes_.back()[n.targets[0]] = JValue::string(std::move(captured));
          break;
        }
        case JNode::Kind::Macro: scopes_.back()[n.attr] = JValue::of_macro(&n); break;
        case JNode::Kind::Break: return Flow::Break;
        case JNode::Kind::Continue: return Flow::Continue;
      }
      if (out.size() > kMaxOutput) fail("rendered text exceeds {} bytes", kMaxOutput);
    }
    return Flow::Normal;
  }

 private:
  void assign(const std::vector<std::string>& targets, JValue v) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = std::move(v);
      return;
    }
    JList items = v.is_sequence() ? *v.list : iterate(v);
    if (items.size() != targets.size())
      fail("cannot unpack {} value(s) into {} name(s)", items.size(), targets.size());
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = items[i];
  }

  // Innermost first; inside a macro, its own scopes and then the top level (globals, variables and
  // top-level sets, scopes 0 and 1), not the scopes of its caller.
  JValue lookup(const std::string& name) const {
    for (size_t i = scopes_.size(); i-- > 0;) {
      if (i < floor_ && i > 1) continue;
      auto f = scopes_[i].find(name);
      if (f != scopes_[i].end()) return f->second;
    }
    return JValue::undefined(fmt::format("'{}' is undefined", name));
  }

  // Arguments bind like jinja2's Macro.__call__: positional, then keyword, then the default
  // (evaluated in the macro's scope), else Undefined.
  JValue call_macro(const JNode& m, const Args& a) {
    const size_t n = m.targets.size();
    if (a.pos.size() > n) fail("macro '{}' takes not more than {} argument(s)", m.attr, n);
    for (const auto& [k, v] : a.kw) {
      auto it = std::find(m.targets.begin(), m.targets.end(), k);
      if (it == m.targets.end()) fail("macro '{}' takes no keyword argument '{}'", m.attr, k);
      if (static_cast<size_t>(it - m.targets.begin()) < a.pos.size())
        fail("macro '{}' got multiple values for argument '{}'", m.attr, k);
    }
    if (macro_depth_ >= kMaxMacroDepth) fail("macro '{}': calls nested deeper than {}", m.attr, kMaxMacroDepth);
    struct Restore {
      Renderer& r;
      size_t floor;
      size_t scopes;
      ~Restore() {
        r.scopes_.resize(scopes);
        r.floor_ = floor;
        --r.macro_depth_;
      }
    } restore{*this, floor_, scopes_.size()};
    ++macro_depth_;
    scopes_.emplace_back();
    floor_ = scopes_.size() - 1;
    for (size_t i = 0; i < n; ++i) {
      const std::string& p = m.targets[i];
      JValue v = JValue::undefined(fmt::format("'{}' is undefined", p));
      auto kw = std::find_if(a.kw.begin(), a.kw.end(), [&](const auto& x) { return x.first == p; });
      if (i < a.pos.size()) v = a.pos[i];
      else if (kw != a.kw.end()) v = kw->second;
      else if (m.defaults[i]) v = eval(*m.defaults[i]);
      scopes_.back()[p] = std::move(v);
    }
    std::string out;
    exec(m.bodies[0], out);
    return JValue::string(std::move(out));
  }

  void exec_for(const JNode& n, std::string& out) {
    JList items = iterate(eval(*n.expr));
    if (n.filter) {
      JList kept;
      for (auto& item : items) {
        scopes_.emplace_back();
        assign(n.targets, item);
        bool keep = jvalue_truthy(eval(*n.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (n.bodies.size() > 1) {
        scopes_.emplace_back();
        exec(n.bodies[1], out);
        scopes_.pop_back();
      }
      return;
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      JDict loop;
      loop.items = {{"index0", JValue::integer(i)},
                    {"index", JValue::integer(i + 1)},
                    {"revindex0", JValue::integer(len - 1 - i)},
                    {"revindex", JValue::integer(len - i)},
                    {"first", JValue::boolean(i == 0)},
                    {"last", JValue::boolean(i == len - 1)},
                    {"length", JValue::integer(len)},
                    {"depth", JValue::integer(1)},
                    {"depth0", JValue::integer(0)},
                    {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : JValue::undefined("loop.previtem of the first item")},
                    {"nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : JValue::undefined("loop.nextitem of the last item")}};
      scopes_.emplace_back();
      scopes_.back()["loop"] = JValue::of_dict(std::move(loop));
      assign(n.targets, items[static_cast<size_t>(i)]);
      Flow f = exec(n.bodies[0], out);
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
  }

  Args eval_args(const JExpr& e, size_t first) {
    Args a;
    for (size_t i = first; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.kw.emplace_back(k, eval(*v));
    return a;
  }


  JValue eval(const JExpr& e) {
    line_ = e.line;
    switch (e.kind) {
      case JExpr::Kind::Literal: return e.value;
      case JExpr::Kind::Name: return lookup(e.name);
      case JExpr::Kind::Attr: {
        JValue obj = eval(*e.args[0]);
        line_ = e.line;
        if (obj.is(K::Undefined)) fail("{} (reading attribute '{}')", obj.s, e.name);
        if (obj.is(K::Dict) || obj.is(K::Namespace)) {
          const JValue* v = obj.dict->find(e.name);
          if (v) return *v;
        }
        return JValue::undefined(fmt::format("'{}' has no attribute '{}'", jvalue_type_name(obj), e.name));
      }
      case JExpr::Kind::Item: {
        JValue obj = eval(*e.args[0]);
        JValue key = eval(*e.args[1]);
        line_ = e.line;
        if (obj.is(K::Undefined)) fail("{} (reading an item)", obj.s);
        if (obj.is(K::Dict) || obj.is(K::Namespace)) {
          const JValue* v = key.is(K::String) ? obj.dict->find(key.s) : nullptr;
          return v ? *v : JValue::undefined(fmt::format("'{}' has no key {}", jvalue_type_name(obj), jvalue_repr(key)));
        }
        if ((obj.is_sequence() || obj.is(K::String)) && (key.is(K::Int) || key.is(K::Bool))) {
          int64_t i = as_int(key, "index");
          if (obj.is(K::String)) {
            std::u32string cps = utf8_decode(obj.s);
            int64_t n = static_cast<int64_t>(cps.size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) return JValue::undefined(fmt::format("string index {} out of range", key.i));
            return JValue::string(utf8_encode(cps.substr(static_cast<size_t>(i), 1)));
          }
          int64_t n = static_cast<int64_t>(obj.list->size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return JValue::undefined(fmt::format("{} index {} out of range", jvalue_type_name(obj), key.i));
          return (*obj.list)[static_cast<size_t>(i)];
        }
        return JValue::undefined(fmt::format("'{}' has no item {}", jvalue_type_name(obj), jvalue_repr(key)));
      }
      case JExpr::Kind::Slice: {
        JValue obj = eval(*e.args[0]);
        JValue parts[3];
        for (int k = 0; k < 3; ++k) parts[k] = e.args[k + 1] ? eval(*e.args[k + 1]) : JValue::none();
        line_ = e.line;
        require_defined(obj);
        if (obj.is(K::String)) {
          std::u32string cps = utf8_decode(obj.s), out;
          for (size_t i : slice_indices(static_cast<int64_t>(cps.size()), parts[0], parts[1], parts[2])) out += cps[i];
          return JValue::string(utf8_encode(out));
        }
        if (!obj.is_sequence()) fail("'{}' object is not subscriptable", jvalue_type_name(obj));
        JList out;
        for (size_t i : slice_indices(static_cast<int64_t>(obj.list->size()), parts[0], parts[1], parts[2]))
          out.push_back((*obj.list)[i]);
        return JValue::of_list(std::move(out), obj.kind);
      }
      case JExpr::Kind::Call: {
        const JExpr& callee = *e.args[0];
        if (callee.kind == JExpr::Kind::Attr) {  // method call: obj.name(args)
          JValue obj = eval(*callee.args[0]);
          Args a = eval_args(e, 1);
          line_ = e.line;
          if (obj.is(K::Undefined)) fail("{} (calling '{}')", obj.s, callee.name);
          if (obj.is(K::String)) return str_method(obj, callee.name, a);
          if (obj.is(K::Dict) || obj.is(K::Namespace)) {
            if (const JValue* f = obj.dict->find(callee.name); f && f->is(K::Function)) return call_global(f->s, a);
            if (const JValue* f = obj.dict->find(callee.name); f && f->is(K::Macro)) {
              const JNode* m = f->macro;  // the dict may change while the macro runs
              JValue r = call_macro(*m, a);
              line_ = e.line;
              return r;
            }
            if (obj.is(K::Namespace)) fail("'Namespace' object has no callable attribute '{}'", callee.name);
            return dict_method(obj, callee.name, a);
          }
          fail("'{}' object has no callable attribute '{}'", jvalue_type_name(obj), callee.name);
        }
        JValue fn = eval(callee);
        Args a = eval_args(e, 1);
        line_ = e.line;
        if (fn.is(K::Undefined)) fail("{} (called as a function)", fn.s);
        if (fn.is(K::Macro)) {
          JValue r = call_macro(*fn.macro, a);
          line_ = e.line;
          return r;
        }
        if (!fn.is(K::Function)) fail("'{}' object is not callable", jvalue_type_name(fn));
        if (fn.s == "strftime_now") return JValue::string(strftime_now(a, env_.now));
        return call_global(fn.s, a);
      }
      case JExpr::Kind::Filter: {
        JValue v = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        line_ = e.line;
        return apply_filter(e.name, v, a);
      }
      case JExpr::Kind::Test: {
        JValue v = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        line_ = e.line;
        return JValue::boolean(apply_test(e.name, v, a) != e.negated);
      }
      case JExpr::Kind::Not: return JValue::boolean(!jvalue_truthy(eval(*e.args[0])));
      case JExpr::Kind::Neg:
      case JExpr::Kind::Pos: {
        JValue v = eval(*e.args[0]);
        line_ = e.line;
        require_defined(v);
        if (!v.is_number()) fail("bad operand type for unary {}: '{}'", e.kind == JExpr::Kind::Neg ? '-' : '+', jvalue_type_name(v));
        if (e.kind == JExpr::Kind::Pos) return v.is(K::Bool) ? JValue::integer(v.b) : v;
        if (v.is(K::Float)) return JValue::real(-v.f);
        return binary_op("-", JValue::integer(0), v);
      }
      case JExpr::Kind::Binary: {
        JValue a = eval(*e.args[0]);
        JValue b = eval(*e.args[1]);
        line_ = e.line;
        return binary_op(e.name, a, b);
      }
      case JExpr::Kind::And: {
        JValue a = eval(*e.args[0]);
        return jvalue_truthy(a) ? eval(*e.args[1]) : a;
      }
      case JExpr::Kind::Or: {
        JValue a = eval(*e.args[0]);
        return jvalue_truthy(a) ? a : eval(*e.args[1]);
      }
      case JExpr::Kind::Cond:
        if (jvalue_truthy(eval(*e.args[0]))) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : JValue::undefined("the else branch of a conditional expression without else");
      case JExpr::Kind::ListLit:
      case JExpr::Kind::TupleLit: {
        JList out;
        for (const auto& x : e.args) out.push_back(eval(*x));
        return JValue::of_list(std::move(out), e.kind == JExpr::Kind::ListLit ? K::List : K::Tuple);
      }
      case JExpr::Kind::DictLit: {
        JDict d;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          JValue k = eval(*e.args[i]);
          line_ = e.line;
          if (!k.is(K::String)) fail("dict literal keys must be strings, found {}", jvalue_type_name(k));
          d.set(k.s, eval(*e.args[i + 1]));
        }
        return JValue::of_dict(std::move(d));
      }
    }
    fail("internal: unknown expression kind");
  }

  std::vector<std::unordered_map<std::string, JValue>> scopes_;
  size_t floor_ = 0;  // inside a macro: its first scope (see lookup)
  int macro_depth_ = 0;
  JinjaEnv env_;
  int line_ = 0;
};

// One line: newlines inside messages (e.g. from raise_exception) are shown escaped.
std::string one_line(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else out += c;
  }
  return out;
}

}  // namespace

std::string jinja_render(const JinjaTemplate& t, const nlohmann::ordered_json& vars, const JinjaEnv& env) {
  if (!t.program) fail("{}: template is not compiled", t.name);
  if (!vars.is_object()) fail("{}: template variables must be a JSON object", t.name);
  std::string out;
  int line = 0;
  try {
    Renderer r(vars, env);
    try {
      r.exec(t.program->body, out);
    } catch (const Error&) {
      line = r.line();
      throw;
    }
  } catch (const Error& e) {
    if (line == 0) throw Error(one_line(fmt::format("{}: template variables: {}", t.name, e.what())));
    throw Error(one_line(fmt::format("{} line {}: {}", t.name, line, e.what())));
  }
  return out;
}

}  // namespace mt
