// Single-threaded encode throughput on real English (Moby Dick), reported as bytes/s.
// usage: mixtune_bench_tokenizer [--tokenizer=DIR] [--text=FILE] [google-benchmark flags]
// Defaults: $MIXTUNE_DATA_DIR (else <source>/.deps/data) /tokenizers/qwen3 and /moby-dick/data.txt
// (fetch them with scripts/fetch-data.sh). --tokenizer=all runs qwen3, deepseek_v3 and gptoss.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/tokenizer.h"

namespace {

std::string data_dir() {
  if (const char* d = std::getenv("MIXTUNE_DATA_DIR"); d && *d) return d;
#ifdef MIXTUNE_SOURCE_DIR
  return std::string(MIXTUNE_SOURCE_DIR) + "/.deps/data";
#else
  return ".deps/data";
#endif
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) mt::fail("cannot open {} (run scripts/fetch-data.sh, or pass --text=FILE)", path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The piece cache warms up during the first iteration; later ones show the steady state.
void bench_encode(benchmark::State& state, const mt::Tokenizer* tok, const std::string* text) {
  int64_t tokens = 0;
  for (auto _ : state) {
    std::vector<int32_t> ids = tok->encode(*text);
    tokens = static_cast<int64_t>(ids.size());
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(text->size()));
  state.counters["tokens"] = static_cast<double>(tokens);
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok_arg = "qwen3", text_path = data_dir() + "/moby-dick/data.txt";
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--tokenizer=", 12) == 0) {
      tok_arg = argv[i] + 12;
    } else if (std::strncmp(argv[i], "--text=", 7) == 0) {
      text_path = argv[i] + 7;
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  try {
    static std::string text = read_text(text_path);
    std::vector<std::string> dirs;
    if (tok_arg == "all") {
      for (const char* n : {"qwen3", "deepseek_v3", "gptoss"}) dirs.push_back(data_dir() + "/tokenizers/" + n);
    } else if (std::filesystem::exists(tok_arg)) {
      dirs.push_back(tok_arg);
    } else {
      dirs.push_back(data_dir() + "/tokenizers/" + tok_arg);
    }
    static std::vector<mt::Tokenizer> toks;
    toks.reserve(dirs.size());
    for (const auto& d : dirs) {
      toks.push_back(mt::Tokenizer::from_file(d));
      const std::string name = "encode/" + std::filesystem::path(d).filename().string();
      benchmark::RegisterBenchmark(name.c_str(), bench_encode, &toks.back(), &text)->Unit(benchmark::kMillisecond);
    }
  } catch (const mt::Error& e) {
    std::fprintf(stderr, "mixtune_bench_tokenizer: error: %s\n", e.what());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
