// The table of chat layouts, and a checkpoint's chat template read as Transformers reads it.
#include "data/chat_format.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "io/json_text.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

constexpr size_t kMaxTemplateFileBytes = size_t{64} << 20;

const std::vector<const ChatFormat*>& formats() {
  static const std::vector<const ChatFormat*> all = {&chat_format_qwen3(), &chat_format_gpt_oss(),
                                                      &chat_format_deepseek_v3()};
  return all;
}

std::string read_small_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) fail("{}: cannot open", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("{}: read error", p.string());
  std::string text = ss.str();
  if (text.size() > kMaxTemplateFileBytes)
    fail("{}: file is too large (expected at most {} bytes, found {})", p.string(), kMaxTemplateFileBytes, text.size());
  return text;
}

}  // namespace

const ChatFormat* chat_format_of(std::string_view template_text) {
  for (const ChatFormat* f : formats())
    if (f->renders(template_text)) return f;
  return nullptr;
}

std::string chat_format_names() {
  std::string out;
  for (const ChatFormat* f : formats()) out += (out.empty() ? "" : ", ") + std::string(f->name);
  return out;
}

ChatOptions chat_options_for_template(std::string_view template_text, ChatOptions options) {
  if (const ChatFormat* f = chat_format_of(template_text); f && f->prepare) f->prepare(options);
  return options;
}

std::string chat_template_from_model_dir(const std::string& dir) {
  // NOTE: Transformers lets chat_template.jinja override tokenizer_config.json's copy.
  const fs::path jinja = fs::path(dir) / "chat_template.jinja";
  if (fs::is_regular_file(jinja)) {
    std::string text = read_small_file(jinja);
    if (!utf8_valid(text)) fail("{}: not valid UTF-8", jinja.string());
    return text;
  }
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  if (!fs::is_regular_file(config)) return "";
  const nlohmann::ordered_json j = json_parse_strict(read_small_file(config), config.string(), 64);
  if (!j.is_object()) fail("{}: expected a JSON object, found {}", config.string(), j.type_name());
  auto it = j.find("chat_template");
  if (it == j.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      const auto& e = (*it)[i];
      if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["name"].is_string() ||
          !e["template"].is_string())
        fail("{}: chat_template[{}]: expected {{\"name\": string, \"template\": string}}", config.string(), i);
      if (e["name"] == "default") return e["template"].get<std::string>();
    }
    fail("{}: chat_template: a list of named templates without one named \"default\"", config.string());
  }
  fail("{}: chat_template: expected a string or a list of named templates, found {}", config.string(),
       it->type_name());
}

}  // namespace mt
