// mixtune command-line entry point: each subcommand lives in its own cmd_*.cpp.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>

#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"mixtune: fine-tune Mixture-of-Experts models stored in Hugging Face format"};
  app.require_subcommand(1);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "mixtune: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
