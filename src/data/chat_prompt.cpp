#include "data/chat_prompt.h"

#include "core/error.h"
#include "data/chat_format.h"
#include "data/chat_template.h"
#include "data/jinja.h"

namespace mt {

std::string chat_prompt_render(const nlohmann::ordered_json& messages_json, const std::string& template_dir,
                               bool enable_thinking, const std::string& what) {
  nlohmann::ordered_json j = messages_json;
  if (j.is_object()) {
    if (!j.contains("messages")) fail("{}: expected a JSON array of messages or an object with \"messages\"", what);
    j = j["messages"];
  }
  const std::vector<ChatMessage> messages = chat_messages_from_json(j, what);
  if (messages.empty()) fail("{}: messages: the array is empty", what);
  ChatOptions co;
  co.add_generation_prompt = true;
  co.enable_thinking = enable_thinking;
  const std::string tmpl = chat_template_from_model_dir(template_dir);
  if (tmpl.empty()) return chat_render_qwen3(messages, co);
  co = chat_options_for_template(tmpl, co);  // a template's own needs (DeepSeek-V3: its BOS, null contents)
  return chat_render(jinja_compile(tmpl, template_dir + " chat template"), messages, co);
}

}  // namespace mt
