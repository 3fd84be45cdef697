// mixtune tokenize --tokenizer DIR (--text S | --file F) [--decode]
// Prints the ids as a JSON array; with --decode the input is a JSON array of ids and the output
// is the decoded string as a JSON string.
#include "cli/cmd_tokenize.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/tokenizer.h"

namespace mt::cli {

namespace {

struct TokenizeArgs {
  std::string tokenizer;
  std::string text;
  std::string file;
  bool decode = false;
};

std::string read_input_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("tokenize: cannot open --file {}", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) fail("tokenize: cannot read --file {}", path);
  return ss.str();
}

std::vector<int32_t> parse_ids(const std::string& input, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(input);
  } catch (const nlohmann::json::exception& e) {
    fail("tokenize --decode: {} is not valid JSON: {}", where, e.what());
  }
  if (!j.is_array()) fail("tokenize --decode: {}: expected a JSON array of token ids, found {}", where, j.type_name());
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer() || j[i].get<int64_t>() < INT32_MIN || j[i].get<int64_t>() > INT32_MAX)
      fail("tokenize --decode: {}[{}]: expected an integer token id, found {}", where, i, j[i].dump());
    ids.push_back(static_cast<int32_t>(j[i].get<int64_t>()));
  }
  return ids;
}

void run_tokenize(const TokenizeArgs& a, const CLI::App& cmd) {
  const bool from_text = cmd.count("--text") > 0;
  const std::string input = from_text ? a.text : read_input_file(a.file);
  const std::string where = from_text ? "--text" : "--file " + a.file;
  const Tokenizer tok = Tokenizer::from_file(a.tokenizer);
  std::string out;
  if (a.decode) {
    // error_handler::replace: decode() already yields valid UTF-8, so dump() cannot throw.
    out = nlohmann::json(tok.decode(parse_ids(input, where))).dump();
  } else {
    out = nlohmann::json(tok.encode(input)).dump();
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text to token ids (JSON array), or decode ids with --decode");
  cmd->add_option("--tokenizer", args->tokenizer, "tokenizer.json, or a directory holding one")->required();
  auto* text = cmd->add_option("--text", args->text, "input given on the command line");
  auto* file = cmd->add_option("--file", args->file, "input read from a file");
  text->excludes(file);
  file->excludes(text);
  cmd->add_flag("--decode", args->decode, "input is a JSON array of ids; print the decoded text as a JSON string");
  cmd->callback([args, cmd] {
    if (cmd->count("--text") + cmd->count("--file") != 1) fail("tokenize: give exactly one of --text or --file");
    run_tokenize(*args, *cmd);
  });
}

}  // namespace mt::cli
