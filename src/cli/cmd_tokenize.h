// mixtune tokenize: encode text to token ids, or decode ids to text, with a tokenizer.json.
#pragma once
#include <CLI/CLI.hpp>

namespace mt::cli {

void add_tokenize_command(CLI::App& app);

}  // namespace mt::cli
