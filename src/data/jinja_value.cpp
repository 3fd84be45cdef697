// Python semantics for the Jinja interpreter's values: truthiness, ==, str()/repr(), json.dumps.
#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/error.h"
#include "data/jinja_ast.h"
#include "io/json_text.h"

namespace mt {

JValue JValue::of_list(JList v, Kind k) {
  JValue x = make(k);
  x.list = std::make_shared<JList>(std::move(v));
  return x;
}

JValue JValue::of_dict(JDict v, Kind k) {
  JValue x = make(k);
  x.dict = std::make_shared<JDict>(std::move(v));
  return x;
}

JValue JValue::of_macro(const JNode* m) {
  JValue x = make(Kind::Macro);
  x.macro = m;
  x.s = m->attr;
  return x;
}

const JValue* JDict::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void JDict::set(const std::string& key, JValue v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

JValue jvalue_from_json(const nlohmann::ordered_json& j) {
  using T = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case T::null: return JValue::none();
    case T::boolean: return JValue::boolean(j.get<bool>());
    case T::number_integer: return JValue::integer(j.get<int64_t>());
    case T::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      // NOTE: Python keeps big integers exact; we would print them differently, so refuse.
      if (u > static_cast<uint64_t>(INT64_MAX)) fail("integer {} is out of the supported range (int64)", u);
      return JValue::integer(static_cast<int64_t>(u));
    }
    case T::number_float: return JValue::real(j.get<double>());
    case T::string: return JValue::string(j.get<std::string>());
    case T::array: {
      JList out;
      out.reserve(j.size());
      for (const auto& e : j) out.push_back(jvalue_from_json(e));
      return JValue::of_list(std::move(out));
    }
    case T::object: {
      JDict d;
      d.items.reserve(j.size());
      for (const auto& [k, v] : j.items()) d.items.emplace_back(k, jvalue_from_json(v));
      return JValue::of_dict(std::move(d));
    }
    default: fail("unsupported JSON value (binary or discarded)");
  }
}

std::string jvalue_type_name(const JValue& v) {
  switch (v.kind) {
    case JValue::Kind::Undefined: return "Undefined";
    case JValue::Kind::None: return "NoneType";
    case JValue::Kind::Bool: return "bool";
    case JValue::Kind::Int: return "int";
    case JValue::Kind::Float: return "float";
    case JValue::Kind::String: return "str";
    case JValue::Kind::List: return "list";
    case JValue::Kind::Tuple: return "tuple";
    case JValue::Kind::Dict: return "dict";
    case JValue::Kind::Namespace: return "Namespace";
    case JValue::Kind::Function: return "function";
    case JValue::Kind::Macro: return "Macro";
  }
  return "?";
}

bool jvalue_truthy(const JValue& v) {
  switch (v.kind) {
    case JValue::Kind::Undefined:
    case JValue::Kind::None: return false;
    case JValue::Kind::Bool: return v.b;
    case JValue::Kind::Int: return v.i != 0;
    case JValue::Kind::Float: return v.f != 0.0;
    case JValue::Kind::String: return !v.s.empty();
    case JValue::Kind::List:
    case JValue::Kind::Tuple: return !v.list->empty();
    case JValue::Kind::Dict: return !v.dict->items.empty();
    case JValue::Kind::Namespace:
    case JValue::Kind::Function:
    case JValue::Kind::Macro: return true;
  }
  return false;
}

namespace {

long double number_of(const JValue& v) {
  if (v.is(JValue::Kind::Bool)) return v.b ? 1 : 0;
  if (v.is(JValue::Kind::Int)) return static_cast<long double>(v.i);
  return v.f;
}

}  // namespace

bool jvalue_equal(const JValue& a, const JValue& b) {
  using K = JValue::Kind;
  if (a.is_number() && b.is_number()) return number_of(a) == number_of(b);  // 1 == 1.0 == True
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case K::Undefined:
    case K::None: return true;
    case K::String:
    case K::Function: return a.s == b.s;
    case K::Macro: return a.macro == b.macro;
    case K::List:
    case K::Tuple:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!jvalue_equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case K::Dict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const JValue* o = b.dict->find(k);
        if (!o || !jvalue_equal(v, *o)) return false;
      }
      return true;
    case K::Namespace: return a.dict == b.dict;
    default: return false;
  }
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's repr layout: fixed for 1e-4 <= |d| < 1e16.
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp = std::stoi(sci.substr(e + 1));
  std::string out = neg ? "-" : "";
  if (exp >= -5 + 1 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  out += exp < 0 ? "e-" : "e+";
  std::string ed = std::to_string(std::abs(exp));
  if (ed.size() < 2) ed = "0" + ed;
  return out + ed;
}

namespace {

std::string repr_string(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t cp : utf8_decode(s)) {
    if (cp == static_cast<uint32_t>(q) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) {
      out += fmt::format("\\x{:02x}", cp);
    } else {
      out += utf8_encode(std::u32string(1, cp));
    }
  }
  return out + q;
}

std::string repr_items(const JValue& v) {
  std::string out;
  bool first = true;
  if (v.is_sequence()) {
    for (const auto& e : *v.list) {
      if (!first) out += ", ";
      first = false;
      out += jvalue_repr(e);
    }
  } else {
    for (const auto& [k, e] : v.dict->items) {
      if (!first) out += ", ";
      first = false;
      out += repr_string(k) + ": " + jvalue_repr(e);
    }
  }
  return out;
}

}  // namespace

std::string jvalue_repr(const JValue& v) {
  switch (v.kind) {
    case JValue::Kind::String: return repr_string(v.s);
    case JValue::Kind::Undefined: return "Undefined";
    // NOTE: fmt rather than "lit" + std::string, which trips GCC 12's false -Wrestrict warning.
    case JValue::Kind::List: return fmt::format("[{}]", repr_items(v));
    case JValue::Kind::Tuple: return fmt::format("({}{})", repr_items(v), v.list->size() == 1 ? "," : "");
    case JValue::Kind::Dict: return fmt::format("{{{}}}", repr_items(v));
    case JValue::Kind::Namespace: return fmt::format("<Namespace {{{}}}>", repr_items(v));
    default: return jvalue_str(v);
  }
}

std::string jvalue_str(const JValue& v) {
  switch (v.kind) {
    case JValue::Kind::Undefined: return "";
    case JValue::Kind::None: return "None";
    case JValue::Kind::Bool: return v.b ? "True" : "False";
    case JValue::Kind::Int: return std::to_string(v.i);
    case JValue::Kind::Float: return python_float_repr(v.f);
    case JValue::Kind::String: return v.s;
    case JValue::Kind::Function: return "<function " + v.s + ">";
    case JValue::Kind::Macro: return "<Macro '" + v.s + "'>";
    default: return jvalue_repr(v);
  }
}

namespace {

void dump_json(const JValue& v, const JsonDumpOptions& o, int level, std::string& out) {
  auto newline = [&](int lvl) {
    if (o.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(o.indent * lvl), ' ');
  };
  auto quote = [&](const std::string& s) { return o.ensure_ascii ? json_quote_python(s) : json_quote_serde(s); };
  switch (v.kind) {
    case JValue::Kind::None: out += "null"; return;
    case JValue::Kind::Bool: out += v.b ? "true" : "false"; return;
    case JValue::Kind::Int: out += std::to_string(v.i); return;
    case JValue::Kind::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += python_float_repr(v.f);
      return;
    case JValue::Kind::String: out += quote(v.s); return;
    case JValue::Kind::List:
    case JValue::Kind::Tuple: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += o.item_sep;
        newline(level + 1);
        dump_json((*v.list)[i], o, level + 1, out);
      }
      newline(level);
      out += "]";
      return;
    }
    case JValue::Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, JValue>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += "{";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_sep;
        newline(level + 1);
        out += quote(items[i]->first) + o.key_sep;
        dump_json(items[i]->second, o, level + 1, out);
      }
      newline(level);
      out += "}";
      return;
    }
    default: fail("tojson: Object of type {} is not JSON serializable", jvalue_type_name(v));
  }
}

}  // namespace

std::string jvalue_tojson(const JValue& v, const JsonDumpOptions& o) {
  std::string out;
  dump_json(v, o, 0, out);
  return out;
}

bool py_isspace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
    bool ok = n >= 0 && i + static_cast<size_t>(n) < s.size();
    for (int k = 1; ok && k <= n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (!ok) {
      out += U'\uFFFD';  // invalid input is rejected upstream; never read past the end
      ++i;
      continue;
    }
    uint32_t cp = n == 0 ? c : n == 1 ? (c & 0x1f) : n == 2 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k <= n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out += static_cast<char32_t>(cp);
    i += static_cast<size_t>(n) + 1;
  }
  return out;
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : s) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  return out;
}

std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right) {
  // Decodes only the code points at the two ends (contents can be long).
  std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : py_isspace(c); };
  auto cont = [&](size_t i) { return (static_cast<unsigned char>(s[i]) & 0xc0) == 0x80; };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e) {
      size_t n = 1;
      while (b + n < e && cont(b + n)) ++n;
      std::u32string cp = utf8_decode(s.substr(b, n));
      if (cp.size() != 1 || !strip_it(cp[0])) break;
      b += n;
    }
  if (right)
    while (e > b) {
      size_t start = e - 1;
      while (start > b && cont(start)) --start;
      std::u32string cp = utf8_decode(s.substr(start, e - start));
      if (cp.size() != 1 || !strip_it(cp[0])) break;
      e = start;
    }
  return std::string(s.substr(b, e - b));
}

}  // namespace mt
