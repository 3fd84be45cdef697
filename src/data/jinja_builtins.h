// Internals of the Jinja interpreter: the operations the evaluator (jinja_render.cpp) applies to
// values, with Python's semantics and error wording. Errors throw mt::Error without a location;
// jinja_render() adds "<template> line N: ".
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/jinja_ast.h"

namespace mt::jinja {

constexpr size_t kMaxOutput = size_t{1} << 30;  // rendered bytes; guards hostile templates

// Positional and keyword arguments of a call, matched to a Python-style parameter list.
struct Args {
  std::vector<JValue> pos;
  std::vector<std::pair<std::string, JValue>> kw;

  // Argument `index` or keyword `name`, else `dflt`.
  JValue get(size_t index, std::string_view name, JValue dflt, std::string_view fn) const;
  // Rejects more than `max_pos` positional arguments and unknown keywords.
  void limit(size_t max_pos, std::initializer_list<std::string_view> names, std::string_view fn) const;
};

[[noreturn]] void fail_undefined(const JValue& v);
void require_defined(const JValue& v);
int64_t as_int(const JValue& v, std::string_view what);

// Python's slice semantics (negative indexes, clamping, negative steps): the picked indexes.
std::vector<size_t> slice_indices(int64_t len, const JValue& start, const JValue& stop, const JValue& step);

// == != < > <= >= in, not in, + - * / // % ** ~ on evaluated operands (and/or short-circuit
// in the evaluator).
JValue binary_op(const std::string& op, const JValue& a, const JValue& b);
JList iterate(const JValue& v);  // for loops: list items, dict keys, string characters
int64_t length_of(const JValue& v);

JValue str_method(const JValue& self, const std::string& name, const Args& a);
JValue dict_method(const JValue& self, const std::string& name, const Args& a);
JValue apply_filter(const std::string& name, const JValue& v, const Args& a);
bool apply_test(const std::string& name, const JValue& v, const Args& a);
JValue call_global(const std::string& name, const Args& a);  // namespace, dict, range, raise_exception

// strftime_now(format): Python's datetime.strftime on `now` (seconds since the epoch, UTC), or on the
// local time now when unset. Directives: %a %A %b %B %d %e %H %I %j %m %M %p %S %u %w %y %Y %D %F
// %R %T %n %t %% (English names, as Python's default C locale); any other is an error.
std::string strftime_now(const Args& a, const std::optional<int64_t>& now);

}  // namespace mt::jinja
