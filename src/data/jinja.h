// A small Jinja2 interpreter for Hugging Face chat templates (the `chat_template` string of
// tokenizer_config.json). It renders as Transformers does: ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and loopcontrols, HF's `tojson` filter (json.dumps, ensure_ascii=False)
// and a `raise_exception` global. Values are Python-like (str/int/float/bool/None/list/dict).
//
// Supported: {{ }}, {% %}, {# #}, whitespace control (- and +); if/elif/else, for (else, inline
// `if` filter, tuple targets, loop.index/index0/revindex/revindex0/first/last/length/previtem/
// nextitem), set (name, ns.attr, block form), break/continue; expressions with literals, lists,
// tuples, dicts, attribute/subscript/slice, calls, filters, tests, `x if c else y`, the operators
// or/and/not/in/not in/is/==/!=/</>/<=/>=/+/-/*/`/`/`//`/%/**/~. Globals: namespace, range,
// raise_exception. Not supported (clear error): macros, call/filter blocks, include/extends, raw.
#pragma once
#include <nlohmann/json.hpp>

#include <memory>
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

// Renders with the top-level variables of `vars` (a JSON object; key order is kept, so
// `tojson` writes objects in their input order as Python dicts do). Runtime errors, including
// raise_exception(), throw a one-line mt::Error "<name> line N: ...".
std::string jinja_render(const JinjaTemplate& t, const nlohmann::ordered_json& vars);

}  // namespace mt
