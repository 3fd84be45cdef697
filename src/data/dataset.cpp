// Dataset::load: JSONL lines (chat, prompt/completion, text, pre-tokenized) -> Examples with labels.
#include "data/dataset.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <optional>

#include "core/error.h"
#include "data/chat_format.h"
#include "data/chat_template.h"
#include "data/dataset_cache.h"
#include "data/tokenizer.h"

namespace mt {

namespace {
using json = nlohmann::ordered_json;

// An error that skip_bad_lines must not swallow (the run is misconfigured, not the line).
struct ConfigError : Error {
  using Error::Error;
};

void append(std::vector<int32_t>& ids, std::vector<int32_t>& labels, const std::vector<int32_t>& piece,
            bool trained) {
  ids.insert(ids.end(), piece.begin(), piece.end());
  if (trained)
    labels.insert(labels.end(), piece.begin(), piece.end());
  else
    labels.insert(labels.end(), piece.size(), -100);
}

const std::string& read_string(const json& obj, const char* field, const std::string& where) {
  auto it = obj.find(field);
  if (it == obj.end()) fail("{}: {}: missing", where, field);
  if (!it->is_string()) fail("{}: {}: expected a string, found {}", where, field, it->type_name());
  return it->get_ref<const std::string&>();
}

std::vector<int32_t> read_id_list(const json& obj, const char* field, const std::string& where, int64_t vocab_size,
                                  bool allow_ignore) {
  const json& list = obj.at(field);
  if (!list.is_array()) fail("{}: {}: expected a list of integers, found {}", where, field, list.type_name());
  std::vector<int32_t> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& v = list[i];
    if (!v.is_number_integer()) fail("{}: {}[{}]: expected an integer, found {}", where, field, i, v.dump());
    // Read as signed 64-bit; huge unsigned values wrap negative and are rejected below.
    const int64_t id = v.get<int64_t>();
    if (allow_ignore && id == -100) {
      out.push_back(-100);
      continue;
    }
    if (id < 0 || id >= vocab_size)
      fail("{}: {}[{}]: token id {} is outside the vocabulary [0, {}){}", where, field, i, id, vocab_size,
           allow_ignore ? " and is not -100" : "");
    out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

const Tokenizer& need_tokenizer(const Tokenizer* tok, const std::string& where, const char* format) {
  if (!tok) throw ConfigError(fmt::format("{}: {}: this format needs a tokenizer, and none was given", where, format));
  return *tok;
}

// The chat template and its layout, set up at the first chat line (a file without one never needs
// the model's template to be one mixtune knows).
struct ChatSetup {
  const DatasetOptions& options;
  std::optional<JinjaTemplate> tmpl;
  const ChatFormat* format = nullptr;

  void ensure() {
    if (tmpl) return;
    const std::string& text = options.chat_template.empty() ? std::string(chat_template_qwen3()) : options.chat_template;
    try {
      tmpl = options.chat_template.empty() ? chat_template_qwen3_compiled() : jinja_compile(text, "chat template");
    } catch (const Error& e) {
      throw ConfigError(fmt::format("{}: the model's {}", options.path, e.what()));
    }
    format = chat_format_of(text);
    if (!format)
      throw ConfigError(fmt::format("{}: the model's chat template is not one whose assistant turns mixtune can mark "
                                    "for answer-only loss (known layouts: {})", options.path, chat_format_names()));
  }
};

// Chat: encode the rendered text piecewise (context, span, context, span, ...) and train on the spans.
// This equals encoding the whole text at once because every span boundary sits next to a special token
// ("<|im_start|>assistant\n" before, "<|im_end|>" at the end; harmony: "<|start|>assistant" before,
// <|return|>/<|end|>/<|call|> at the end), and added tokens split the text before the BPE pre-tokenizer
// runs, so no BPE merge or regex match can cross a boundary.
// The boundary after "assistant\n" is the exception in principle ("\n" then content); Qwen3's
// pre-tokenizer regex keeps "\n" apart from a following letter but can join "\n" with following
// newlines/spaces, so a content starting with whitespace may tokenize differently than in one pass.
// That is the same choice TRL makes (its assistant mask is built from the same text pieces). (Harmony's
// spans start with <|channel|> or " to=", which the GPT-OSS regex never joins to "assistant".)
void example_from_chat(const json& obj, const std::string& where, const Tokenizer& tok, ChatSetup& chat,
                       Example& ex) {
  chat.ensure();
  const std::vector<ChatMessage> messages = chat_messages_from_json(obj.at("messages"), where);
  ChatOptions copt;
  copt.add_generation_prompt = false;
  copt.enable_thinking = chat.options.enable_thinking;
  copt.now = chat.options.chat_now;
  if (auto it = obj.find("tools"); it != obj.end()) copt.tools = chat_tools_from_json(*it, where);
  if (auto it = obj.find("chat_template_kwargs"); it != obj.end())
    copt.template_kwargs = chat_template_kwargs_from_json(*it, where);
  ChatRender render;
  try {
    render = chat.format->render_spans(*chat.tmpl, messages, copt);
  } catch (const Error& e) {
    fail("{}: {}", where, e.what());
  }
  const std::string_view text = render.text;
  size_t at = 0;
  for (const ChatSpan& span : render.assistant_spans) {
    MT_CHECK(span.first >= at && span.second >= span.first && span.second <= text.size(), "bad span [{}, {})",
             span.first, span.second);
    append(ex.input_ids, ex.labels, tok.encode(text.substr(at, span.first - at)), false);
    append(ex.input_ids, ex.labels, tok.encode(text.substr(span.first, span.second - span.first)), true);
    at = span.second;
  }
  append(ex.input_ids, ex.labels, tok.encode(text.substr(at)), false);
}

// Parses one non-blank line into `ex`; throws mt::Error naming where and the field.
void example_from_line(const std::string& line, const std::string& where, const Tokenizer* tok,
                       int64_t vocab_size, ChatSetup& chat, Example& ex) {
  json obj = json::parse(line, nullptr, false);
  if (obj.is_discarded()) fail("{}: line: not valid JSON", where);
  if (!obj.is_object()) fail("{}: line: expected a JSON object, found {}", where, obj.type_name());

  std::optional<int32_t> eos;
  if (tok) eos = tok->token_to_id("<|endoftext|>");

  if (obj.contains("messages")) {
    example_from_chat(obj, where, need_tokenizer(tok, where, "messages"), chat, ex);
  } else if (obj.contains("prompt") || obj.contains("completion")) {
    const std::string& prompt = read_string(obj, "prompt", where);
    const std::string& completion = read_string(obj, "completion", where);
    const Tokenizer& t = need_tokenizer(tok, where, "prompt");
    append(ex.input_ids, ex.labels, t.encode(prompt), false);
    append(ex.input_ids, ex.labels, t.encode(completion), true);
    if (eos) append(ex.input_ids, ex.labels, {*eos}, true);
  } else if (obj.contains("text")) {
    const std::string& text = read_string(obj, "text", where);
    const Tokenizer& t = need_tokenizer(tok, where, "text");
    append(ex.input_ids, ex.labels, t.encode(text), true);
    if (eos) append(ex.input_ids, ex.labels, {*eos}, true);
  } else if (obj.contains("input_ids")) {
    // Pre-tokenized: taken as given (no EOS added); position_ids, if any, are ignored (the loader makes them).
    ex.input_ids = read_id_list(obj, "input_ids", where, vocab_size, false);
    if (auto it = obj.find("labels"); it != obj.end() && !it->is_null()) {
      ex.labels = read_id_list(obj, "labels", where, vocab_size, true);
      if (ex.labels.size() != ex.input_ids.size())
        fail("{}: labels: has {} values but input_ids has {}", where, ex.labels.size(), ex.input_ids.size());
    } else {
      ex.labels = ex.input_ids;
    }
  } else {
    fail("{}: line: no known format (expected a 'messages', 'prompt'+'completion', 'text' or 'input_ids' key)",
         where);
  }
  if (ex.input_ids.empty()) fail("{}: input_ids: the example has no tokens", where);
  for (size_t i = 0; i < ex.input_ids.size(); ++i)
    if (ex.input_ids[i] < 0 || ex.input_ids[i] >= vocab_size)
      fail("{}: input_ids[{}]: token id {} is outside the model vocabulary [0, {})", where, i, ex.input_ids[i],
           vocab_size);
}
}  // namespace

Dataset Dataset::load(const DatasetOptions& options, const Tokenizer* tokenizer, int64_t vocab_size) {
  if (options.truncation != "right" && options.truncation != "drop")
    fail("data.truncation: '{}' is not a valid choice (valid: right, drop)", options.truncation);
  if (options.seq_len <= 0) fail("data.seq_len: must be positive, found {}", options.seq_len);
  if (vocab_size <= 0) fail("{}: vocab_size must be positive, found {}", options.path, vocab_size);
  std::ifstream f(options.path, std::ios::binary);
  if (!f) fail("{}: cannot open", options.path);

  Dataset d;
  uint64_t cache_key = 0;
  std::string cache_path;
  if (!options.cache_dir.empty()) {
    cache_key = dataset_cache_key(options, tokenizer, vocab_size);
    cache_path = dataset_cache_path(options, cache_key);
    if (dataset_cache_read(cache_path, cache_key, vocab_size, options.seq_len, d.examples_, d.stats_)) return d;
  }
  DatasetStats& st = d.stats_;
  const bool truncate_right = options.truncation == "right";
  ChatSetup chat{options, std::nullopt, nullptr};
  std::string line;
  int64_t line_no = 0;
  while (std::getline(f, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++st.lines;
    const std::string where = options.path + ":" + std::to_string(line_no);
    Example ex;
    try {
      example_from_line(line, where, tokenizer, vocab_size, chat, ex);
    } catch (const ConfigError&) {
      throw;
    } catch (const Error&) {
      if (!options.skip_bad_lines) throw;
      ++st.skipped_bad_lines;
      continue;
    }
    if (static_cast<int64_t>(ex.input_ids.size()) > options.seq_len) {
      if (!truncate_right) {
        ++st.dropped_too_long;
        continue;
      }
      ex.input_ids.resize(options.seq_len);
      ex.labels.resize(options.seq_len);
      ++st.truncated;
    }
    // An example with no trained label is kept: it still gives context to the others packed in its row
    // (and a chat whose only assistant turn was truncated away is common).
    st.tokens += static_cast<int64_t>(ex.input_ids.size());
    for (int32_t l : ex.labels) st.trained_tokens += l != -100;
    d.examples_.push_back(std::move(ex));
  }
  if (f.bad()) fail("{}: read error", options.path);
  st.examples = static_cast<int64_t>(d.examples_.size());
  if (d.examples_.empty())
    fail("{}: no examples ({} lines, {} skipped as malformed, {} dropped as longer than {} tokens)", options.path,
         st.lines, st.skipped_bad_lines, st.dropped_too_long, options.seq_len);
  if (!cache_path.empty()) dataset_cache_write(cache_path, cache_key, d.examples_, st);
  return d;
}

}  // namespace mt
