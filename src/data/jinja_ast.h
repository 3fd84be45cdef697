// Internals of the Jinja interpreter (jinja.h): runtime values, the parsed tree, and the
// Python-compatible helpers (str(), repr(), json.dumps, str.strip, slicing) the renderer needs.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mt {

// ---- values -------------------------------------------------------------------------------

struct JValue;
using JList = std::vector<JValue>;
struct JDict;
struct JNode;

struct JValue {
  // Namespace is a mutable dict (namespace()); Tuple renders like a list but prints "(a, b)".
  // Function is a global (namespace, range, ...); Macro a {% macro %} of the template being rendered.
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Tuple, Dict, Namespace, Function, Macro };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;                  // String; the global's name for Function; why, for Undefined
  std::shared_ptr<JList> list;    // List, Tuple
  std::shared_ptr<JDict> dict;    // Dict, Namespace
  const JNode* macro = nullptr;   // Macro: its definition (values never outlive the render)

  static JValue none() { return make(Kind::None); }
  static JValue boolean(bool v) { JValue x = make(Kind::Bool); x.b = v; return x; }
  static JValue integer(int64_t v) { JValue x = make(Kind::Int); x.i = v; return x; }
  static JValue real(double v) { JValue x = make(Kind::Float); x.f = v; return x; }
  static JValue string(std::string v) { JValue x = make(Kind::String); x.s = std::move(v); return x; }
  static JValue undefined(std::string why) { JValue x; x.s = std::move(why); return x; }
  static JValue of_list(JList v, Kind k = Kind::List);
  static JValue of_dict(JDict v, Kind k = Kind::Dict);
  static JValue function(std::string name) { JValue x = make(Kind::Function); x.s = std::move(name); return x; }
  static JValue of_macro(const JNode* m);
  static JValue make(Kind k) { JValue x; x.kind = k; return x; }

  bool is(Kind k) const { return kind == k; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_sequence() const { return kind == Kind::List || kind == Kind::Tuple; }
};

struct JDict {
  std::vector<std::pair<std::string, JValue>> items;  // insertion order, like a Python dict
  const JValue* find(std::string_view key) const;
  void set(const std::string& key, JValue v);
};

JValue jvalue_from_json(const nlohmann::ordered_json& j);
std::string jvalue_type_name(const JValue& v);  // Python's type name: "str", "int", "NoneType", ...
bool jvalue_truthy(const JValue& v);
bool jvalue_equal(const JValue& a, const JValue& b);
std::string jvalue_str(const JValue& v);   // Python str(); Undefined prints as ""
std::string jvalue_repr(const JValue& v);  // Python repr()

// HF's tojson: json.dumps(x, ensure_ascii, indent, separators, sort_keys). indent < 0 = None.
struct JsonDumpOptions {
  bool ensure_ascii = false;
  int indent = -1;
  std::string item_sep = ", ";  // Python's default is ", " without indent and "," with it
  std::string key_sep = ": ";
  bool sort_keys = false;
};
std::string jvalue_tojson(const JValue& v, const JsonDumpOptions& o);
std::string python_float_repr(double d);

// Python str methods on UTF-8 text, by code point.
bool py_isspace(uint32_t cp);
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);
// strip/lstrip/rstrip; chars == nullptr strips whitespace (str.isspace()).
std::string py_strip(std::string_view s, const std::string* chars, bool left, bool right);

// ---- parsed template ----------------------------------------------------------------------

struct JExpr;
using JExprPtr = std::unique_ptr<JExpr>;

struct JExpr {
  enum class Kind {
    Literal,   // value
    Name,      // name
    Attr,      // args[0].name
    Item,      // args[0][args[1]]
    Slice,     // args[0][args[1]:args[2]:args[3]] (null = omitted)
    Call,      // args[0](args[1..], kwargs)
    Filter,    // args[0] | name(args[1..], kwargs)
    Test,      // args[0] is [not] name(args[1..]); negated
    Not,       // not args[0]
    Neg,       // -args[0]
    Pos,       // +args[0]
    Binary,    // args[0] op args[1]
    And, Or,   // short-circuit
    Cond,      // args[1] if args[0] else args[2] (args[2] may be null: undefined)
    ListLit, TupleLit, DictLit,  // DictLit: args = k0, v0, k1, v1, ...
  };
  Kind kind = Kind::Literal;
  int line = 0;
  JValue value;
  std::string name;  // Name, Attr, Call-free names of Filter/Test, Binary operator
  bool negated = false;
  std::vector<JExprPtr> args;
  std::vector<std::pair<std::string, JExprPtr>> kwargs;
};

struct JNode;
using JBody = std::vector<JNode>;

struct JNode {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Break, Continue, Macro };
  Kind kind = Kind::Text;
  int line = 0;
  std::string text;                    // Text
  JExprPtr expr;                       // Output, Set value, For iterable
  std::vector<JExprPtr> conditions;    // If: one per if/elif branch
  std::vector<JBody> bodies;           // If: one per branch (+1 for else); For: body (+ else)
  std::vector<std::string> targets;    // For: loop variables; Set/SetBlock: names; Macro: parameters
  std::string attr;                    // Set: `ns.attr` assignment (targets[0] = ns); Macro: its name
  JExprPtr filter;                     // For: inline `if`
  std::vector<JExprPtr> defaults;      // Macro: one per parameter (null = no default)
};

struct JinjaProgram {
  JBody body;
};

namespace jinja {

// Data is template text; the tag delimiters are tokens of their own; Op holds operators/brackets.
struct Token {
  enum class K { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Str, Int, Float, Op, Eof };
  K k;
  std::string s;  // text, name, decoded string literal, number spelling, operator
  int line;
};

// Normalises newlines, drops one trailing newline (jinja2's keep_trailing_newline=False) and
// tokenizes; errors name "<name> line N".
std::vector<Token> lex(std::string_view text, std::string_view name);

}  // namespace jinja

}  // namespace mt
