// OpenAI-format message parsing, checks, and rendering through a chat template.
#include "data/chat_template.h"

#include "core/error.h"
#include "io/json_text.h"

namespace mt {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kRoles[] = {"system", "developer", "user", "assistant", "tool"};
constexpr const char* kRoleList = "system, developer, user, assistant, tool";
// The variables chat_render sets from ChatOptions' own fields.
constexpr std::string_view kReservedVars[] = {"messages", "tools", "add_generation_prompt", "enable_thinking"};

std::string at(std::string_view what, const std::string& field) {
  return what.empty() ? field : fmt::format("{}: {}", what, field);
}

bool role_valid(std::string_view r) {
  for (auto v : kRoles)
    if (r == v) return true;
  return false;
}

std::string require_string(const ojson& j, std::string_view what, const std::string& field) {
  if (!j.is_string()) fail("{}: expected a string, found {}", at(what, field), j.type_name());
  return j.get<std::string>();
}

ChatToolCall tool_call_from_json(const ojson& j, std::string_view what, const std::string& field) {
  if (!j.is_object()) fail("{}: expected an object, found {}", at(what, field), j.type_name());
  if (j.contains("type") && j["type"] != "function")
    fail("{}.type: expected \"function\", found {}", at(what, field), json_quote_short(j["type"].dump()));
  std::string f = field;
  const ojson* fn = &j;
  if (j.contains("function")) {
    f += ".function";
    fn = &j["function"];
    if (!fn->is_object()) fail("{}: expected an object, found {}", at(what, f), fn->type_name());
  }
  ChatToolCall call;
  if (!fn->contains("name")) fail("{}.name: missing", at(what, f));
  call.name = require_string((*fn)["name"], what, f + ".name");
  if (call.name.empty()) fail("{}.name: empty function name", at(what, f));
  if (!fn->contains("arguments")) fail("{}.arguments: missing", at(what, f));
  call.arguments = (*fn)["arguments"];
  if (!call.arguments.is_string() && !call.arguments.is_object())
    fail("{}.arguments: expected a JSON string or object, found {}", at(what, f), call.arguments.type_name());
  return call;
}

void check_utf8(const std::string& s, std::string_view field_what) {
  if (!utf8_valid(s)) fail("{}: text is not valid UTF-8", field_what);
}

// What chat_render checks on messages built in code (the JSON parser checks the same things).
void check_messages(const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  if (messages.empty()) fail("messages: empty conversation");
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string f = fmt::format("messages[{}]", i);
    if (!role_valid(m.role))
      fail("{}.role: unknown role {} (valid: {})", f, json_quote_short(m.role), kRoleList);
    check_utf8(m.content, f + ".content");
    if (m.content_null && (m.role != "assistant" || m.tool_calls.empty() || !m.content.empty()))
      fail("{}.content: null only on an assistant message with tool calls, and then without text", f);
    if (m.reasoning_content) check_utf8(*m.reasoning_content, f + ".reasoning_content");
    if (m.thinking) check_utf8(*m.thinking, f + ".thinking");
    if (!m.tool_calls.empty() && m.role != "assistant")
      fail("{}.tool_calls: only assistant messages may have tool calls (role is '{}')", f, m.role);
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      const ChatToolCall& c = m.tool_calls[k];
      std::string cf = fmt::format("{}.tool_calls[{}]", f, k);
      if (c.name.empty()) fail("{}.name: empty function name", cf);
      check_utf8(c.name, cf + ".name");
      if (!c.arguments.is_string() && !c.arguments.is_object())
        fail("{}.arguments: expected a JSON string or object, found {}", cf, c.arguments.type_name());
    }
  }
  chat_tools_from_json(options.tools, "");
  chat_template_kwargs_from_json(options.template_kwargs, "");
}

}  // namespace

std::vector<ChatMessage> chat_messages_from_json(const ojson& messages, std::string_view what) {
  if (!messages.is_array()) fail("{}: expected an array, found {}", at(what, "messages"), messages.type_name());
  if (messages.empty()) fail("{}: empty conversation", at(what, "messages"));
  std::vector<ChatMessage> out;
  out.reserve(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& j = messages[i];
    std::string f = fmt::format("messages[{}]", i);
    if (!j.is_object()) fail("{}: expected an object, found {}", at(what, f), j.type_name());
    ChatMessage m;
    if (!j.contains("role")) fail("{}.role: missing", at(what, f));
    m.role = require_string(j["role"], what, f + ".role");
    if (!role_valid(m.role))
      fail("{}.role: unknown role {} (valid: {})", at(what, f), json_quote_short(m.role), kRoleList);
    if (j.contains("tool_calls") && !j["tool_calls"].is_null()) {
      const ojson& calls = j["tool_calls"];
      if (!calls.is_array()) fail("{}.tool_calls: expected an array, found {}", at(what, f), calls.type_name());
      if (m.role != "assistant" && !calls.empty())
        fail("{}.tool_calls: only assistant messages may have tool calls (role is '{}')", at(what, f), m.role);
      for (size_t k = 0; k < calls.size(); ++k)
        m.tool_calls.push_back(tool_call_from_json(calls[k], what, fmt::format("{}.tool_calls[{}]", f, k)));
    }
    const bool content_optional = m.role == "assistant" && !m.tool_calls.empty();
    if (!j.contains("content") || j["content"].is_null()) {
      // NOTE: HF's Qwen3 template fails on a null content; OpenAI writes null next to tool calls.
      if (!content_optional) fail("{}.content: missing (only an assistant message with tool calls may omit it)", at(what, f));
      m.content_null = true;
    } else if (j["content"].is_array()) {
      fail("{}.content: expected a string, found array (content parts are not supported)", at(what, f));
    } else {
      m.content = require_string(j["content"], what, f + ".content");
    }
    if (j.contains("reasoning_content") && !j["reasoning_content"].is_null())
      m.reasoning_content = require_string(j["reasoning_content"], what, f + ".reasoning_content");
    if (j.contains("thinking") && !j["thinking"].is_null())
      m.thinking = require_string(j["thinking"], what, f + ".thinking");
    out.push_back(std::move(m));
  }
  return out;
}

ojson chat_tools_from_json(const ojson& tools, std::string_view what) {
  if (tools.is_null()) return tools;
  if (!tools.is_array()) fail("{}: expected an array or null, found {}", at(what, "tools"), tools.type_name());
  for (size_t i = 0; i < tools.size(); ++i)
    if (!tools[i].is_object())
      fail("{}: expected an object, found {}", at(what, fmt::format("tools[{}]", i)), tools[i].type_name());
  return tools;
}

ojson chat_template_kwargs_from_json(const ojson& kwargs, std::string_view what) {
  if (kwargs.is_null()) return kwargs;
  if (!kwargs.is_object())
    fail("{}: expected an object or null, found {}", at(what, "chat_template_kwargs"), kwargs.type_name());
  for (const auto& [k, v] : kwargs.items())
    for (std::string_view r : kReservedVars)
      if (k == r)
        fail("{}: set by mixtune itself, not by chat_template_kwargs", at(what, "chat_template_kwargs." + k));
  return kwargs;
}

ojson chat_messages_to_json(const std::vector<ChatMessage>& messages, bool null_content) {
  ojson out = ojson::array();
  for (const ChatMessage& m : messages) {
    ojson j = {{"role", m.role}, {"content", m.content_null && null_content ? ojson() : ojson(m.content)}};
    if (m.reasoning_content) j["reasoning_content"] = *m.reasoning_content;
    if (m.thinking) j["thinking"] = *m.thinking;
    if (!m.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const ChatToolCall& c : m.tool_calls)
        calls.push_back({{"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      j["tool_calls"] = std::move(calls);
    }
    out.push_back(std::move(j));
  }
  return out;
}

std::string chat_render(const JinjaTemplate& tmpl, const std::vector<ChatMessage>& messages, const ChatOptions& options) {
  check_messages(messages, options);
  ojson vars = ojson::object();
  vars["messages"] = chat_messages_to_json(messages, options.null_content);
  vars["tools"] = options.tools;
  vars["add_generation_prompt"] = options.add_generation_prompt;
  vars["enable_thinking"] = options.enable_thinking;
  if (options.template_kwargs.is_object())
    for (const auto& [k, v] : options.template_kwargs.items()) vars[k] = v;
  JinjaEnv env;
  env.now = options.now;
  return jinja_render(tmpl, vars, env);
}

}  // namespace mt
