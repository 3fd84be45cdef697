// A generation prompt from OpenAI-style messages: the chat template Transformers would use for the model (the
// tokenizer directory's chat_template.jinja or tokenizer_config.json; the built-in Qwen3 template when it has
// none), rendered with add_generation_prompt. `mixtune generate --chat` and the library's apply_chat_template.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace mt {

// messages: a JSON array of messages, or an object holding one under "messages"; `what` names it in errors.
std::string chat_prompt_render(const nlohmann::ordered_json& messages, const std::string& template_dir,
                               bool enable_thinking, const std::string& what);

}  // namespace mt
