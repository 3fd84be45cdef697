// Jinja builtins with Python semantics: operators, iteration, str/dict methods, filters, tests
// and the globals (namespace, dict, range, raise_exception).
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "data/jinja_builtins.h"

namespace mt::jinja {

namespace {

using K = JValue::Kind;
constexpr int64_t kMaxRange = 100'000;  // range() length; guards hostile templates

double as_float(const JValue& v) { return v.is(K::Float) ? v.f : v.is(K::Int) ? static_cast<double>(v.i) : (v.b ? 1.0 : 0.0); }

const std::string& as_str(const JValue& v, std::string_view what);

int64_t checked(long double exact, int64_t value, std::string_view op) {
  if (exact != static_cast<long double>(value) || exact > static_cast<long double>(INT64_MAX) ||
      exact < static_cast<long double>(INT64_MIN))
    fail("integer overflow in '{}'", op);
  return value;
}

std::string ascii_case(std::string s, bool upper) {
  // NOTE: ASCII only; Python also maps non-ASCII letters. Chat templates apply this to role names.
  for (char& c : s) c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

JValue Args::get(size_t index, std::string_view name, JValue dflt, std::string_view fn) const {
  for (const auto& [k, v] : kw)
    if (k == name) {
      if (index < pos.size()) fail("{}() got multiple values for argument '{}'", fn, name);
      return v;
    }
  return index < pos.size() ? pos[index] : dflt;
}

void Args::limit(size_t max_pos, std::initializer_list<std::string_view> names, std::string_view fn) const {
  if (pos.size() > max_pos) fail("{}() takes at most {} positional argument(s), {} given", fn, max_pos, pos.size());
  for (const auto& kv : kw)
    if (std::find(names.begin(), names.end(), kv.first) == names.end())
      fail("{}() got an unexpected keyword argument '{}'", fn, kv.first);
}

// An Undefined carries why it is undefined ("'x' is undefined", "list index 3 out of range").
[[noreturn]] void fail_undefined(const JValue& v) { fail("{}", v.s.empty() ? "value is undefined" : v.s); }

void require_defined(const JValue& v) {
  if (v.is(K::Undefined)) fail_undefined(v);
}

int64_t as_int(const JValue& v, std::string_view what) {
  if (v.is(K::Int)) return v.i;
  if (v.is(K::Bool)) return v.b ? 1 : 0;
  require_defined(v);
  fail("{} must be an integer, found {}", what, jvalue_type_name(v));
}

namespace {
const std::string& as_str(const JValue& v, std::string_view what) {
  require_defined(v);
  if (!v.is(K::String)) fail("{} must be a string, found {}", what, jvalue_type_name(v));
  return v.s;
}
}  // namespace

// Python's slice.indices(): clamps start/stop for the given step.
std::vector<size_t> slice_indices(int64_t len, const JValue& start, const JValue& stop, const JValue& step) {
  auto opt = [](const JValue& v, std::string_view what) -> std::optional<int64_t> {
    if (v.is(K::None) || v.is(K::Undefined)) return std::nullopt;
    return as_int(v, what);
  };
  int64_t st = opt(step, "slice step").value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) v += len;
    if (st > 0) return std::clamp<int64_t>(v, 0, len);
    return std::clamp<int64_t>(v, -1, len - 1);
  };
  int64_t b = clamp(opt(start, "slice start"), st > 0 ? 0 : len - 1);
  int64_t e = clamp(opt(stop, "slice stop"), st > 0 ? len : -1);
  std::vector<size_t> idx;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) idx.push_back(static_cast<size_t>(i));
  return idx;
}

JValue binary_op(const std::string& op, const JValue& a, const JValue& b) {
  if (op == "==") return JValue::boolean(jvalue_equal(a, b));
  if (op == "!=") return JValue::boolean(!jvalue_equal(a, b));
  if (op == "~") return JValue::string(jvalue_str(a) + jvalue_str(b));
  if (op == "in" || op == "not in") {
    bool r = false;
    if (b.is(K::String)) {
      r = b.s.find(as_str(a, "left operand of 'in <string>'")) != std::string::npos;
    } else if (b.is_sequence()) {
      r = std::any_of(b.list->begin(), b.list->end(), [&](const JValue& x) { return jvalue_equal(a, x); });
    } else if (b.is(K::Dict)) {
      r = a.is(K::String) && b.dict->find(a.s) != nullptr;
    } else if (!b.is(K::Undefined)) {  // Undefined iterates as empty
      fail("argument of type '{}' is not iterable", jvalue_type_name(b));
    }
    return JValue::boolean(op == "in" ? r : !r);
  }
  require_defined(a);
  require_defined(b);
  auto type_error = [&]() -> JValue {
    fail("unsupported operand type(s) for {}: '{}' and '{}'", op, jvalue_type_name(a), jvalue_type_name(b));
  };
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && !a.is(K::Float) && !b.is(K::Float);
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    int c;
    if (nums) {
      long double x = a.is(K::Float) ? a.f : as_int(a, "operand"), y = b.is(K::Float) ? b.f : as_int(b, "operand");
      c = x < y ? -1 : x > y ? 1 : 0;
      if (std::isnan(static_cast<double>(x)) || std::isnan(static_cast<double>(y))) return JValue::boolean(false);
    } else if (a.is(K::String) && b.is(K::String)) {
      c = a.s.compare(b.s);  // UTF-8 byte order = code point order
    } else {
      fail("'{}' not supported between instances of '{}' and '{}'", op, jvalue_type_name(a), jvalue_type_name(b));
    }
    bool r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
    return JValue::boolean(r);
  }
  if (op == "+") {
    if (ints) {
      int64_t x = as_int(a, "operand"), y = as_int(b, "operand");
      return JValue::integer(checked(static_cast<long double>(x) + y, static_cast<int64_t>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y)), op));
    }
    if (nums) return JValue::real(as_float(a) + as_float(b));
    if (a.is(K::String) && b.is(K::String)) return JValue::string(a.s + b.s);
    if (a.is_sequence() && a.kind == b.kind) {
      JList l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return JValue::of_list(std::move(l), a.kind);
    }
    return type_error();
  }
  if (op == "-") {
    if (ints) {
      int64_t x = as_int(a, "operand"), y = as_int(b, "operand");
      return JValue::integer(checked(static_cast<long double>(x) - y, static_cast<int64_t>(static_cast<uint64_t>(x) - static_cast<uint64_t>(y)), op));
    }
    if (nums) return JValue::real(as_float(a) - as_float(b));
    return type_error();
  }
  if (op == "*") {
    if (ints) {
      int64_t x = as_int(a, "operand"), y = as_int(b, "operand");
      return JValue::integer(checked(static_cast<long double>(x) * y, static_cast<int64_t>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y)), op));
    }
    if (nums) return JValue::real(as_float(a) * as_float(b));
    const JValue* seq = a.is_number() ? &b : &a;
    const JValue* cnt = a.is_number() ? &a : &b;
    if (cnt->is_number() && !cnt->is(K::Float) && (seq->is(K::String) || seq->is_sequence())) {
      int64_t n = std::max<int64_t>(0, as_int(*cnt, "repeat count"));
      size_t unit = seq->is(K::String) ? seq->s.size() : seq->list->size();
      if (unit != 0 && static_cast<uint64_t>(n) > kMaxOutput / unit) fail("repetition result is too large");
      if (seq->is(K::String)) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq->s;
        return JValue::string(std::move(out));
      }
      JList out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq->list->begin(), seq->list->end());
      return JValue::of_list(std::move(out), seq->kind);
    }
    return type_error();
  }
  if (op == "/" || op == "//" || op == "%") {
    if (!nums) {
      if (op == "%" && a.is(K::String)) fail("printf-style string formatting ('%') is not supported");
      return type_error();
    }
    if (as_float(b) == 0.0) fail("division by zero");
    if (op == "/") return JValue::real(as_float(a) / as_float(b));
    if (ints) {
      int64_t x = as_int(a, "operand"), y = as_int(b, "operand");
      if (x == INT64_MIN && y == -1) fail("integer overflow in '{}'", op);
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors toward -inf
        --q;
        r += y;
      }
      return JValue::integer(op == "//" ? q : r);
    }
    double x = as_float(a), y = as_float(b);
    if (op == "//") return JValue::real(std::floor(x / y));
    double r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return JValue::real(r);
  }
  if (op == "**") {
    if (!nums) return type_error();
    if (ints && as_int(b, "exponent") >= 0) {
      int64_t base = as_int(a, "base"), e = as_int(b, "exponent"), r = 1;
      for (int64_t i = 0; i < e; ++i) {
        r = checked(static_cast<long double>(r) * base, static_cast<int64_t>(static_cast<uint64_t>(r) * static_cast<uint64_t>(base)), op);
        if (r == 0 || r == 1) break;
      }
      if (base == -1) r = (e % 2) ? -1 : 1;
      return JValue::integer(r);
    }
    return JValue::real(std::pow(as_float(a), as_float(b)));
  }
  fail("unknown operator '{}'", op);
}

JList iterate(const JValue& v) {
  switch (v.kind) {
    case K::Undefined: return {};
    case K::List:
    case K::Tuple: return *v.list;
    case K::Dict: {
      JList keys;
      for (const auto& kv : v.dict->items) keys.push_back(JValue::string(kv.first));
      return keys;
    }
    case K::String: {
      JList chars;
      for (char32_t c : utf8_decode(v.s)) chars.push_back(JValue::string(utf8_encode(std::u32string(1, c))));
      return chars;
    }
    default: fail("'{}' object is not iterable", jvalue_type_name(v));
  }
}

int64_t length_of(const JValue& v) {
  switch (v.kind) {
    case K::Undefined: return 0;
    case K::String: return static_cast<int64_t>(utf8_decode(v.s).size());
    case K::List:
    case K::Tuple: return static_cast<int64_t>(v.list->size());
    case K::Dict:
    case K::Namespace: return static_cast<int64_t>(v.dict->items.size());
    default: fail("object of type '{}' has no len()", jvalue_type_name(v));
  }
}


JValue str_method(const JValue& self, const std::string& name, const Args& a) {
  const std::string& s = self.s;
  const std::string fn = "str." + name;
  if (name == "startswith" || name == "endswith") {
    a.limit(1, {}, fn);
    if (a.pos.empty()) fail("{}() takes exactly one argument", fn);
    std::vector<std::string> probes;
    if (a.pos[0].is(K::Tuple) || a.pos[0].is(K::List)) {
      for (const auto& x : *a.pos[0].list) probes.push_back(as_str(x, fn + " argument"));
    } else {
      probes.push_back(as_str(a.pos[0], fn + " argument"));
    }
    for (const auto& p : probes) {
      bool hit = p.size() <= s.size() &&
                 (name == "startswith" ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0);
      if (hit) return JValue::boolean(true);
    }
    return JValue::boolean(false);
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    a.limit(1, {"chars"}, fn);
    JValue chars = a.get(0, "chars", JValue::none(), fn);
    std::string set;
    if (!chars.is(K::None)) set = as_str(chars, fn + " argument");
    return JValue::string(py_strip(s, chars.is(K::None) ? nullptr : &set, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    a.limit(2, {"sep", "maxsplit"}, fn);
    JValue sep = a.get(0, "sep", JValue::none(), fn);
    int64_t maxsplit = as_int(a.get(1, "maxsplit", JValue::integer(-1), fn), "maxsplit");
    JList parts;
    if (sep.is(K::None)) {  // runs of whitespace, no empty parts
      std::u32string cps = utf8_decode(s);
      std::vector<std::u32string> words;
      size_t i = 0;
      if (name == "rsplit") std::reverse(cps.begin(), cps.end());
      while (i < cps.size()) {
        while (i < cps.size() && py_isspace(cps[i])) ++i;
        if (i >= cps.size()) break;
        if (maxsplit >= 0 && static_cast<int64_t>(words.size()) == maxsplit) {
          size_t e = cps.size();
          while (e > i && py_isspace(cps[e - 1])) --e;
          words.push_back(cps.substr(i, e - i));
          break;
        }
        size_t b = i;
        while (i < cps.size() && !py_isspace(cps[i])) ++i;
        words.push_back(cps.substr(b, i - b));
      }
      if (name == "rsplit") {
        std::reverse(words.begin(), words.end());
        for (auto& w : words) std::reverse(w.begin(), w.end());
      }
      for (auto& w : words) parts.push_back(JValue::string(utf8_encode(w)));
      return JValue::of_list(std::move(parts));
    }
    const std::string& d = as_str(sep, fn + " separator");
    if (d.empty()) fail("empty separator");
    std::vector<std::string> pieces;
    if (name == "split") {
      size_t b = 0;
      for (;;) {
        size_t e = (maxsplit >= 0 && static_cast<int64_t>(pieces.size()) == maxsplit) ? std::string::npos : s.find(d, b);
        if (e == std::string::npos) {
          pieces.push_back(s.substr(b));
          break;
        }
        pieces.push_back(s.substr(b, e - b));
        b = e + d.size();
      }
    } else {
      size_t e = s.size();
      for (;;) {
        size_t f = (maxsplit >= 0 && static_cast<int64_t>(pieces.size()) == maxsplit) || e < d.size()
                       ? std::string::npos
                       : s.rfind(d, e - d.size());
        if (f == std::string::npos) {
          pieces.push_back(s.substr(0, e));
          break;
        }
        pieces.push_back(s.substr(f + d.size(), e - f - d.size()));
        e = f;
      }
      std::reverse(pieces.begin(), pieces.end());
    }
    for (auto& p : pieces) parts.push_back(JValue::string(std::move(p)));
    return JValue::of_list(std::move(parts));
  }
  if (name == "upper" || name == "lower") {
    a.limit(0, {}, fn);
    return JValue::string(ascii_case(s, name == "upper"));
  }
  if (name == "replace") {
    a.limit(3, {}, fn);
    if (a.pos.size() < 2) fail("{}() takes at least 2 arguments", fn);
    const std::string& from = as_str(a.pos[0], fn + " argument");
    const std::string& to = as_str(a.pos[1], fn + " argument");
    int64_t count = a.pos.size() > 2 ? as_int(a.pos[2], "count") : -1;
    std::string out;
    if (from.empty()) fail("{}(): replacing the empty string is not supported", fn);
    size_t b = 0;
    for (int64_t n = 0; count < 0 || n < count; ++n) {
      size_t f = s.find(from, b);
      if (f == std::string::npos) break;
      out += s.substr(b, f - b) + to;
      b = f + from.size();
    }
    return JValue::string(out + s.substr(b));
  }
  if (name == "find" || name == "count") {
    a.limit(1, {}, fn);
    if (a.pos.empty()) fail("{}() takes exactly one argument", fn);
    const std::string& sub = as_str(a.pos[0], fn + " argument");
    if (name == "find") {
      size_t f = s.find(sub);
      return JValue::integer(f == std::string::npos ? -1 : static_cast<int64_t>(utf8_decode(s.substr(0, f)).size()));
    }
    if (sub.empty()) return JValue::integer(length_of(self) + 1);
    int64_t c = 0;
    for (size_t f = s.find(sub); f != std::string::npos; f = s.find(sub, f + sub.size())) ++c;
    return JValue::integer(c);
  }
  fail("'str' object has no attribute '{}'", name);
}

JValue dict_method(const JValue& self, const std::string& name, const Args& a) {
  const std::string fn = "dict." + name;
  if (name == "items" || name == "keys" || name == "values") {
    a.limit(0, {}, fn);
    JList out;
    for (const auto& [k, v] : self.dict->items) {
      if (name == "keys") out.push_back(JValue::string(k));
      else if (name == "values") out.push_back(v);
      else out.push_back(JValue::of_list({JValue::string(k), v}, K::Tuple));
    }
    return JValue::of_list(std::move(out));
  }
  if (name == "get") {
    a.limit(2, {}, fn);
    if (a.pos.empty()) fail("{}() takes at least 1 argument", fn);
    const JValue* v = a.pos[0].is(K::String) ? self.dict->find(a.pos[0].s) : nullptr;
    return v ? *v : (a.pos.size() > 1 ? a.pos[1] : JValue::none());
  }
  fail("'dict' object has no attribute '{}'", name);
}

JValue apply_filter(const std::string& name, const JValue& v, const Args& a) {
  if (name == "length" || name == "count") {
    a.limit(0, {}, name);
    return JValue::integer(length_of(v));
  }
  if (name == "tojson") {  // HF: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    a.limit(4, {"ensure_ascii", "indent", "separators", "sort_keys"}, name);
    JsonDumpOptions o;
    o.ensure_ascii = jvalue_truthy(a.get(0, "ensure_ascii", JValue::boolean(false), name));
    JValue indent = a.get(1, "indent", JValue::none(), name);
    if (!indent.is(K::None)) {
      o.indent = static_cast<int>(std::clamp<int64_t>(as_int(indent, "tojson indent"), 0, 64));
      o.item_sep = ",";
    }
    JValue seps = a.get(2, "separators", JValue::none(), name);
    if (!seps.is(K::None)) {
      if (!seps.is_sequence() || seps.list->size() != 2) fail("tojson separators must be a pair of strings");
      o.item_sep = as_str((*seps.list)[0], "tojson item separator");
      o.key_sep = as_str((*seps.list)[1], "tojson key separator");
    }
    o.sort_keys = jvalue_truthy(a.get(3, "sort_keys", JValue::boolean(false), name));
    return JValue::string(jvalue_tojson(v, o));
  }
  if (name == "string") {
    a.limit(0, {}, name);
    return JValue::string(jvalue_str(v));
  }
  if (name == "trim") {
    a.limit(1, {"chars"}, name);
    JValue chars = a.get(0, "chars", JValue::none(), name);
    std::string set = chars.is(K::None) ? "" : as_str(chars, "trim chars");
    return JValue::string(py_strip(jvalue_str(v), chars.is(K::None) ? nullptr : &set, true, true));
  }
  if (name == "upper" || name == "lower") {
    a.limit(0, {}, name);
    return JValue::string(ascii_case(jvalue_str(v), name == "upper"));
  }
  if (name == "capitalize") {
    a.limit(0, {}, name);
    std::string s = ascii_case(jvalue_str(v), false);
    if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return JValue::string(s);
  }
  if (name == "first" || name == "last") {
    a.limit(0, {}, name);
    JList items = iterate(v);
    if (items.empty()) return JValue::undefined(fmt::format("{} of an empty sequence", name));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") {
    a.limit(1, {"d"}, name);
    std::string sep = jvalue_str(a.get(0, "d", JValue::string(""), name));
    std::string out;
    JList items = iterate(v);
    for (size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + jvalue_str(items[i]);
    return JValue::string(out);
  }
  if (name == "default" || name == "d") {
    a.limit(2, {"default_value", "boolean"}, name);
    JValue dflt = a.get(0, "default_value", JValue::string(""), name);
    bool boolean = jvalue_truthy(a.get(1, "boolean", JValue::boolean(false), name));
    if (v.is(K::Undefined) || (boolean && !jvalue_truthy(v))) return dflt;
    return v;
  }
  if (name == "list") {
    a.limit(0, {}, name);
    return JValue::of_list(iterate(v));
  }
  if (name == "items") {
    a.limit(0, {}, name);
    if (v.is(K::Undefined)) return JValue::of_list({});
    if (!v.is(K::Dict)) fail("items filter expects a mapping, found {}", jvalue_type_name(v));
    return dict_method(v, "items", Args{});
  }
  if (name == "reverse") {
    a.limit(0, {}, name);
    if (v.is(K::String)) {
      std::u32string cps = utf8_decode(v.s);
      std::reverse(cps.begin(), cps.end());
      return JValue::string(utf8_encode(cps));
    }
    JList items = iterate(v);
    std::reverse(items.begin(), items.end());
    return JValue::of_list(std::move(items));
  }
  if (name == "safe") return v;
  if (name == "int") {
    if (v.is(K::Float)) {
      if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) fail("int filter: {} is out of range", python_float_repr(v.f));
      return JValue::integer(static_cast<int64_t>(v.f));
    }
    if (v.is_number()) return JValue::integer(as_int(v, "int"));
    if (v.is(K::String)) {
      std::string t = py_strip(v.s, nullptr, true, true);
      errno = 0;
      char* end = nullptr;
      long long i = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && end == t.c_str() + t.size() && errno == 0) return JValue::integer(i);
      double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && end == t.c_str() + t.size() && std::isfinite(d) && std::fabs(d) < 9.2e18)
        return JValue::integer(static_cast<int64_t>(d));
    }
    return JValue::integer(0);  // jinja2 returns the default (0) for what it cannot convert
  }
  if (name == "float") {
    if (v.is(K::String)) {
      std::string t = py_strip(v.s, nullptr, true, true);
      char* end = nullptr;
      double d = std::strtod(t.c_str(), &end);
      return JValue::real(!t.empty() && end == t.c_str() + t.size() ? d : 0.0);
    }
    return JValue::real(v.is_number() ? as_float(v) : 0.0);
  }
  if (name == "abs") {
    if (v.is(K::Int)) return JValue::integer(checked(std::fabs(static_cast<long double>(v.i)), v.i < 0 ? -v.i : v.i, "abs"));
    if (v.is_number()) return JValue::real(std::fabs(as_float(v)));
    fail("bad operand type for abs(): '{}'", jvalue_type_name(v));
  }
  fail("unknown filter '{}'", name);
}

bool apply_test(const std::string& name, const JValue& v, const Args& a) {
  auto arg = [&](std::string_view test) -> const JValue& {
    if (a.pos.size() != 1 || !a.kw.empty()) fail("test '{}' takes exactly one argument", test);
    return a.pos[0];
  };
  if (name == "defined") return !v.is(K::Undefined);
  if (name == "undefined") return v.is(K::Undefined);
  if (name == "none") return v.is(K::None);
  if (name == "true") return v.is(K::Bool) && v.b;
  if (name == "false") return v.is(K::Bool) && !v.b;
  if (name == "boolean") return v.is(K::Bool);
  if (name == "string") return v.is(K::String);
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is(K::Int);
  if (name == "float") return v.is(K::Float);
  if (name == "mapping") return v.is(K::Dict);
  if (name == "sequence") return v.is(K::String) || v.is_sequence() || v.is(K::Dict);
  if (name == "iterable") return v.is(K::String) || v.is_sequence() || v.is(K::Dict) || v.is(K::Undefined);
  if (name == "callable") return v.is(K::Function) || v.is(K::Macro);
  if (name == "odd" || name == "even") return (as_int(v, "value") % 2 != 0) == (name == "odd");
  if (name == "divisibleby") {
    int64_t d = as_int(arg(name), "divisor");
    if (d == 0) fail("division by zero");
    return as_int(v, "value") % d == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return jvalue_equal(v, arg(name));
  if (name == "ne" || name == "!=") return !jvalue_equal(v, arg(name));
  if (name == "sameas") {
    const JValue& o = arg(name);
    if (v.kind != o.kind) return false;
    if (v.is(K::None) || v.is(K::Bool)) return jvalue_equal(v, o);
    return (v.list && v.list == o.list) || (v.dict && v.dict == o.dict);
  }
  if (name == "in") return jvalue_truthy(binary_op("in", v, arg(name)));
  for (const char* op : {"lt", "gt", "le", "ge"}) {
    if (name == op) {
      static const std::unordered_map<std::string, std::string> sym = {{"lt", "<"}, {"gt", ">"}, {"le", "<="}, {"ge", ">="}};
      return jvalue_truthy(binary_op(sym.at(name), v, arg(name)));
    }
  }
  if (name == "lower" || name == "upper") return v.is(K::String) && ascii_case(v.s, name == "upper") == v.s;
  fail("unknown test '{}'", name);
}

JValue call_global(const std::string& name, const Args& a) {
  if (name == "raise_exception") {
    a.limit(1, {}, name);
    fail("raise_exception: {}", a.pos.empty() ? std::string() : jvalue_str(a.pos[0]));
  }
  if (name == "namespace" || name == "dict") {
    JDict d;
    if (!a.pos.empty()) {
      if (a.pos.size() > 1 || !a.pos[0].is(K::Dict)) fail("{}() takes keyword arguments or one mapping", name);
      d = *a.pos[0].dict;
    }
    for (const auto& [k, v] : a.kw) d.set(k, v);
    return JValue::of_dict(std::move(d), name == "namespace" ? K::Namespace : K::Dict);
  }
  if (name == "range") {
    a.limit(3, {}, name);
    if (a.pos.empty()) fail("range expected at least 1 argument, got 0");
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = as_int(a.pos[0], "range stop");
    } else {
      start = as_int(a.pos[0], "range start");
      stop = as_int(a.pos[1], "range stop");
      if (a.pos.size() == 3) step = as_int(a.pos[2], "range step");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    long double span = step > 0 ? static_cast<long double>(stop) - start : static_cast<long double>(start) - stop;
    long double count = span <= 0 ? 0 : std::ceil(span / std::fabs(static_cast<long double>(step)));
    if (count > kMaxRange) fail("range() longer than {} items", kMaxRange);
    JList out;
    out.reserve(static_cast<size_t>(count));
    for (int64_t k = 0; k < static_cast<int64_t>(count); ++k) out.push_back(JValue::integer(start + k * step));
    return JValue::of_list(std::move(out));
  }
  fail("'{}' is not callable", name);
}

std::string strftime_now(const Args& a, const std::optional<int64_t>& now) {
  a.limit(1, {}, "strftime_now");
  if (a.pos.size() != 1) fail("strftime_now() takes exactly one argument (the format)");
  const std::string& format = as_str(a.pos[0], "strftime_now format");
  constexpr int64_t kLast = 253402300799;  // 9999-12-31T23:59:59Z: years keep four digits
  std::tm tm{};
  if (now) {
    if (*now < 0 || *now > kLast) fail("strftime_now: the fixed clock {} is outside 1970-9999", *now);
    const std::time_t t = static_cast<std::time_t>(*now);
    if (!gmtime_r(&t, &tm)) fail("strftime_now: cannot convert the fixed clock {}", *now);
  } else {
    const std::time_t t = std::time(nullptr);
    if (!localtime_r(&t, &tm)) fail("strftime_now: cannot read the local time");
  }
  static constexpr const char* kDays[] = {"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"};
  static constexpr const char* kMonths[] = {"January", "February", "March",     "April",   "May",      "June",
                                            "July",    "August",   "September", "October", "November", "December"};
  const int hour12 = tm.tm_hour % 12 == 0 ? 12 : tm.tm_hour % 12;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i == format.size()) fail("strftime_now: the format ends with a lone '%'");
    switch (format[i]) {
      case 'a': out += std::string_view(kDays[tm.tm_wday]).substr(0, 3); break;
      case 'A': out += kDays[tm.tm_wday]; break;
      case 'b': out += std::string_view(kMonths[tm.tm_mon]).substr(0, 3); break;
      case 'B': out += kMonths[tm.tm_mon]; break;
      case 'd': out += fmt::format("{:02}", tm.tm_mday); break;
      case 'e': out += fmt::format("{:2}", tm.tm_mday); break;
      case 'H': out += fmt::format("{:02}", tm.tm_hour); break;
      case 'I': out += fmt::format("{:02}", hour12); break;
      case 'j': out += fmt::format("{:03}", tm.tm_yday + 1); break;
      case 'm': out += fmt::format("{:02}", tm.tm_mon + 1); break;
      case 'M': out += fmt::format("{:02}", tm.tm_min); break;
      case 'p': out += tm.tm_hour < 12 ? "AM" : "PM"; break;
      case 'S': out += fmt::format("{:02}", tm.tm_sec); break;
      case 'u': out += fmt::format("{}", tm.tm_wday == 0 ? 7 : tm.tm_wday); break;
      case 'w': out += fmt::format("{}", tm.tm_wday); break;
      case 'y': out += fmt::format("{:02}", (tm.tm_year + 1900) % 100); break;
      case 'Y': out += fmt::format("{}", tm.tm_year + 1900); break;
      case 'D': out += fmt::format("{:02}/{:02}/{:02}", tm.tm_mon + 1, tm.tm_mday, (tm.tm_year + 1900) % 100); break;
      case 'F': out += fmt::format("{}-{:02}-{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday); break;
      case 'R': out += fmt::format("{:02}:{:02}", tm.tm_hour, tm.tm_min); break;
      case 'T': out += fmt::format("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec); break;
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case '%': out += '%'; break;
      default: fail("strftime_now: format directive '%{}' is not supported", format[i]);
    }
  }
  return out;
}

}  // namespace mt::jinja
