// tokenizer.json -> TokenizerImpl. Accepts what HF tokenizers 0.23 would load for a byte-level
// BPE file and refuses, with the file and the field named, anything whose behaviour is not
// implemented here (other models, normalizers, pre-tokenizers, decoders, unk/byte fallback, ...).
#include <nlohmann/json.hpp>

#include <string>

#include "core/error.h"
#include "data/tokenizer_impl.h"
#include "data/tokenizer_unicode.h"

namespace mt {

namespace {

using nlohmann::json;

std::string found_str(const json& j) {
  std::string s = j.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return fmt::format("{} {}", j.type_name(), s);
}

struct Reader {
  const std::string& source;

  [[noreturn]] void bad(const std::string& field, std::string_view expected, const json& found) const {
    fail("{}: field '{}': expected {}, found {}", source, field, expected, found_str(found));
  }
  const json& need(const json& obj, const std::string& parent, const char* key) const {
    const std::string field = parent.empty() ? key : parent + "." + key;
    auto it = obj.find(key);
    if (it == obj.end()) fail("{}: field '{}' is missing", source, field);
    return *it;
  }
  const json* maybe(const json& obj, const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  const json& object(const json& obj, const std::string& parent, const char* key) const {
    const json& v = need(obj, parent, key);
    if (!v.is_object()) bad(parent.empty() ? key : parent + "." + key, "an object", v);
    return v;
  }
  std::string str(const json& obj, const std::string& parent, const char* key) const {
    const json& v = need(obj, parent, key);
    if (!v.is_string()) bad(parent + "." + key, "a string", v);
    return v.get<std::string>();
  }
  bool flag(const json& obj, const std::string& parent, const char* key, bool dflt) const {
    const json* v = maybe(obj, key);
    if (!v) return dflt;
    if (!v->is_boolean()) bad(parent + "." + key, "true or false", *v);
    return v->get<bool>();
  }
  bool required_flag(const json& obj, const std::string& parent, const char* key) const {
    const json& v = need(obj, parent, key);
    if (!v.is_boolean()) bad(parent + "." + key, "true or false", v);
    return v.get<bool>();
  }
  // "type" of a component object, e.g. normalizer.type
  std::string type_of(const json& obj, const std::string& field) const {
    if (!obj.is_object()) bad(field, "an object", obj);
    return str(obj, field, "type");
  }
  [[noreturn]] void unsupported(const std::string& field, std::string_view what, std::string_view supported) const {
    fail("{}: field '{}': unsupported {} (mixtune supports {})", source, field, what, supported);
  }
};

void load_normalizer(const Reader& r, const json& root, TokenizerImpl& t) {
  const json* n = r.maybe(root, "normalizer");
  if (!n) return;
  const std::string type = r.type_of(*n, "normalizer");
  if (type == "NFC") {
    t.nfc = true;
  } else if (type == "Sequence") {
    const json& list = r.need(*n, "normalizer", "normalizers");
    if (!list.is_array()) r.bad("normalizer.normalizers", "an array", list);
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string f = fmt::format("normalizer.normalizers[{}]", i);
      const std::string sub = r.type_of(list[i], f);
      if (sub != "NFC") r.unsupported(f + ".type", fmt::format("normalizer '{}'", sub), "NFC, a Sequence of NFC, or null");
      t.nfc = true;  // NFC is idempotent, so repeats change nothing
    }
  } else {
    r.unsupported("normalizer.type", fmt::format("normalizer '{}'", type), "NFC, a Sequence of NFC, or null");
  }
}

void load_split(const Reader& r, const json& split, const std::string& f, TokenizerImpl& t) {
  const json& pattern = r.object(split, f, "pattern");
  const json* regex = r.maybe(pattern, "Regex");
  if (!regex || !regex->is_string()) r.unsupported(f + ".pattern", "pattern " + found_str(pattern), "{\"Regex\": ...}");
  const std::string behavior = r.str(split, f, "behavior");
  if (behavior != "Isolated") r.unsupported(f + ".behavior", "behavior '" + behavior + "'", "Isolated");
  if (r.flag(split, f, "invert", false)) r.unsupported(f + ".invert", "invert=true", "invert=false");
  t.splits.push_back(std::make_unique<TokenizerRegex>(regex->get<std::string>(), r.source + ": field '" + f + ".pattern.Regex'"));
}

void load_byte_level(const Reader& r, const json& bl, const std::string& f, TokenizerImpl& t) {
  t.byte_level_prefix_space = r.flag(bl, f, "add_prefix_space", true);
  if (r.flag(bl, f, "use_regex", true)) {
    // GPT-2's split, hard-coded in HF's pre_tokenizers/byte_level.rs
    t.byte_level_regex = std::make_unique<TokenizerRegex>(
        R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "ByteLevel regex");
  }
}

void load_pre_tokenizer(const Reader& r, const json& root, TokenizerImpl& t) {
  constexpr const char* kSupported = "ByteLevel, or a Sequence of Split(Regex, Isolated) stages ending in ByteLevel";
  const json* p = r.maybe(root, "pre_tokenizer");
  if (!p) r.unsupported("pre_tokenizer", "null pre_tokenizer", kSupported);
  const std::string type = r.type_of(*p, "pre_tokenizer");
  if (type == "ByteLevel") {
    load_byte_level(r, *p, "pre_tokenizer", t);
    return;
  }
  if (type != "Sequence") r.unsupported("pre_tokenizer.type", "pre_tokenizer '" + type + "'", kSupported);
  const json& list = r.need(*p, "pre_tokenizer", "pretokenizers");
  if (!list.is_array()) r.bad("pre_tokenizer.pretokenizers", "an array", list);
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string f = fmt::format("pre_tokenizer.pretokenizers[{}]", i);
    const std::string sub = r.type_of(list[i], f);
    const bool last = i + 1 == list.size();
    if (sub == "Split" && !last) {
      load_split(r, list[i], f, t);
    } else if (sub == "ByteLevel" && last) {
      load_byte_level(r, list[i], f, t);
    } else {
      r.unsupported(f + ".type", "pre_tokenizer '" + sub + "' at this position", kSupported);
    }
  }
  if (list.empty()) r.unsupported("pre_tokenizer.pretokenizers", "an empty Sequence", kSupported);
}

void load_decoder_and_post_processor(const Reader& r, const json& root) {
  const json* d = r.maybe(root, "decoder");
  if (!d) r.unsupported("decoder", "null decoder", "ByteLevel");
  const std::string type = r.type_of(*d, "decoder");
  if (type != "ByteLevel") r.unsupported("decoder.type", "decoder '" + type + "'", "ByteLevel");
  // Post-processors only act with add_special_tokens=true (or trim offsets); encode() never adds.
  const json* pp = r.maybe(root, "post_processor");
  if (!pp) return;
  const std::string ptype = r.type_of(*pp, "post_processor");
  auto known = [](const std::string& s) {
    return s == "ByteLevel" || s == "TemplateProcessing" || s == "RobertaProcessing" || s == "BertProcessing";
  };
  if (ptype == "Sequence") {
    const json& list = r.need(*pp, "post_processor", "processors");
    if (!list.is_array()) r.bad("post_processor.processors", "an array", list);
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string f = fmt::format("post_processor.processors[{}]", i);
      const std::string sub = r.type_of(list[i], f);
      if (!known(sub)) r.unsupported(f + ".type", "post_processor '" + sub + "'", "ByteLevel, TemplateProcessing, Roberta/BertProcessing");
    }
  } else if (!known(ptype)) {
    r.unsupported("post_processor.type", "post_processor '" + ptype + "'", "ByteLevel, TemplateProcessing, Roberta/BertProcessing");
  }
}

std::unique_ptr<BpeModel> load_model(const Reader& r, const json& root) {
  const json& m = r.object(root, "", "model");
  const json* type = r.maybe(m, "type");
  if (type && (!type->is_string() || type->get<std::string>() != "BPE"))
    r.unsupported("model.type", "model " + found_str(*type), "BPE");
  if (const json* d = r.maybe(m, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0))
    r.unsupported("model.dropout", "dropout " + found_str(*d), "null");
  if (const json* u = r.maybe(m, "unk_token")) r.unsupported("model.unk_token", "unk_token " + found_str(*u), "null");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = r.maybe(m, key);
    if (v && !(v->is_string() && v->get<std::string>().empty()))
      r.unsupported(std::string("model.") + key, found_str(*v), "null or \"\"");
  }
  if (r.flag(m, "model", "byte_fallback", false)) r.unsupported("model.byte_fallback", "byte_fallback=true", "false");
  const bool ignore_merges = r.flag(m, "model", "ignore_merges", false);

  const json& vocab_json = r.object(m, "model", "vocab");
  TokenIdMap vocab;
  vocab.reserve(vocab_json.size());
  for (auto it = vocab_json.begin(); it != vocab_json.end(); ++it) {
    if (!it.value().is_number_integer()) r.bad("model.vocab[\"" + it.key() + "\"]", "an integer id", it.value());
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > INT32_MAX) r.bad("model.vocab[\"" + it.key() + "\"]", "an id in [0, 2^31)", it.value());
    vocab.emplace(it.key(), static_cast<int32_t>(id));
  }

  const json& merges_json = r.need(m, "model", "merges");
  if (!merges_json.is_array()) r.bad("model.merges", "an array", merges_json);
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(merges_json.size());
  for (size_t i = 0; i < merges_json.size(); ++i) {
    const json& e = merges_json[i];
    const std::string f = fmt::format("model.merges[{}]", i);
    if (e.is_string()) {
      // Legacy "a b" lines, split on every space as HF does; "#version" lines are skipped.
      const std::string& line = e.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        r.bad(f, "\"left right\" (two tokens, one space)", e);
      merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      r.bad(f, "\"left right\" or [\"left\", \"right\"]", e);
    }
  }
  return std::make_unique<BpeModel>(std::move(vocab), merges, ignore_merges, r.source);
}

void load_added_tokens(const Reader& r, const json& root, TokenizerImpl& t) {
  const json* list = r.maybe(root, "added_tokens");
  if (!list) return;
  if (!list->is_array()) r.bad("added_tokens", "an array", *list);
  // Ids as HF's AddedVocabulary::add_tokens assigns them: the model's id for a known content,
  // otherwise the next free id after the model vocabulary. A file that says otherwise is refused.
  int32_t next_id = static_cast<int32_t>(t.model->size());
  for (size_t i = 0; i < list->size(); ++i) {
    const json& a = (*list)[i];
    const std::string f = fmt::format("added_tokens[{}]", i);
    if (!a.is_object()) r.bad(f, "an object", a);
    AddedToken tok;
    tok.content = r.str(a, f, "content");
    tok.special = r.required_flag(a, f, "special");
    tok.normalized = r.required_flag(a, f, "normalized");
    for (const char* key : {"lstrip", "rstrip", "single_word"})
      if (r.required_flag(a, f, key)) r.unsupported(f + "." + key, std::string(key) + "=true", "false");
    const json& id_json = r.need(a, f, "id");
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 || id_json.get<int64_t>() > INT32_MAX)
      r.bad(f + ".id", "an id in [0, 2^31)", id_json);
    const auto file_id = static_cast<int32_t>(id_json.get<int64_t>());
    if (tok.content.empty()) continue;  // HF ignores empty tokens
    if (!utf8_is_valid(tok.content)) fail("{}: field '{}.content': not valid UTF-8", r.source, f);

    int32_t id;
    if (auto known = t.added_ids.find(tok.content); known != t.added_ids.end()) {
      id = known->second;
    } else if (auto in_model = t.model->token_to_id(tok.content)) {
      id = *in_model;
    } else {
      id = next_id++;
    }
    if (id != file_id)
      fail("{}: field '{}.id': token '{}' is given id {}, but HF tokenizers would assign it id {}", r.source, f,
           tok.content, file_id, id);
    tok.decoded = tok.normalized && t.nfc ? nfc_normalize(tok.content) : tok.content;
    if (tok.special) t.special_contents.insert(tok.content);
    t.added_ids[tok.content] = id;
    t.added[id] = std::move(tok);
  }
  int64_t overlapping = 0;
  for (const auto& [id, tok] : t.added) {
    (tok.normalized ? t.normalized_matcher : t.raw_matcher).add(tok.normalized ? tok.decoded : tok.content, id);
    overlapping += t.model->token_to_id(tok.content).has_value();
  }
  t.vocab_size = t.model->size() + static_cast<int64_t>(t.added.size()) - overlapping;
}

}  // namespace

std::shared_ptr<const TokenizerImpl> tokenizer_load(std::string_view json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", source, e.what());
  }
  const Reader r{source};
  if (!root.is_object()) r.bad("(top level)", "an object", root);
  auto t = std::make_shared<TokenizerImpl>();
  t->source = source;
  load_normalizer(r, root, *t);
  load_pre_tokenizer(r, root, *t);
  load_decoder_and_post_processor(r, root);
  t->model = load_model(r, root);
  t->vocab_size = t->model->size();
  load_added_tokens(r, root, *t);
  return t;
}

}  // namespace mt
