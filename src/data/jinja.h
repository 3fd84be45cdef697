// A small Jinja2 interpreter for Hugging Face chat templates (the `chat_template` string of
// tokenizer_config.json). It renders as Transformers does: ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and loopcontrols, HF's `tojson` filter (json.dumps, ensure_ascii=False)
// and a `raise_exception` global. Values are Python-like (str/int/float/bool/None/list/dict).
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (- and +); if/elif/else, for (else, inline
// `if` filter, tuple targets, loop.index/index0/revindex/revindex0/first/last/length/previtem/
// nextitem), set (name, ns.attr, block form), break/continue; expressions with literals, lists,
// tuples, dicts, attribute/subscript/slice, calls, filters, tests, `x if c else y`, the operators
// or/and/not/in/not in/is/==/!=/</>/<=/>=/+/-/*/`/`/`//`/%/**/~; macros (positional, keyword and
// default arguments, recursion; a macro sees its arguments and the template's top-level names, as
// in jinja2). Globals: namespace, range, dict, raise_exception, strftime_now. Not supported (clear
// error): call/filter blocks, caller(), varargs/kwargs in macros, include/extends, raw.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace mt {

struct JinjaProgram;  // parsed template (jinja_ast.h)

struct JinjaTemplate {
  std::shared_ptr<const JinjaProgram> program;
  std::string name;  // used in error messages, e.g. "Qwen3 chat template"
};

// Parses `text`. Syntax errors throw mt::Error "<name> line N: ...".
JinjaTemplate jinja_compile(std::string_view text, std::string_view name);

// What the host gives a template besides its variables.
struct JinjaEnv {
  // The clock of strftime_now(format): this instant (seconds since the Unix epoch, years 1970-9999),
  // formatted in UTC. Unset: the machine's local time now, as Transformers' datetime.now() does, so
  // the text then depends on the day and the time zone.
  std::optional<int64_t> now;
};

// Renders with the top-level variables of `vars` (a JSON object; key order is kept, so
// `tojson` writes objects in their input order as Python dicts do). Runtime errors, including
// raise_exception(), throw a one-line mt::Error "<name> line N: ...".
std::string jinja_render(const JinjaTemplate& t, const nlohmann::ordered_json& vars, const JinjaEnv& env = {});

}  // namespace mt
