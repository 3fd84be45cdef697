// generation_config.json: sampling defaults and EOS ids (int or list, config.json's as fallback), and
// one-line errors naming the file and the field.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "core/error.h"
#include "models/generation_config.h"

namespace mt {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string error_of(const json& j) {
  try {
    generation_config_from_json(j, "gc.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(GenerationConfig, ReadsQwen3StyleFields) {
  const auto g = generation_config_from_json(
      json::parse(R"({"bos_token_id": 151643, "do_sample": true, "eos_token_id": [151645, 151643],
                      "pad_token_id": 151643, "temperature": 0.6, "top_k": 20, "top_p": 0.95})"),
      "gc.json");
  EXPECT_EQ(g.do_sample, true);
  EXPECT_EQ(g.temperature, 0.6);
  EXPECT_EQ(g.top_p, 0.95);
  EXPECT_EQ(g.top_k, 20);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{151645, 151643}));
  const auto h = generation_config_from_json(json::parse(R"({"eos_token_id": 2, "temperature": null})"), "gc.json");
  EXPECT_EQ(h.eos_token_ids, (std::vector<int64_t>{2}));
  EXPECT_FALSE(h.temperature.has_value());
  EXPECT_FALSE(h.do_sample.has_value());
}

TEST(GenerationConfig, BadFieldsNameFileAndField) {
  EXPECT_EQ(error_of(json::array()), "gc.json: expected a JSON object, found array");
  EXPECT_EQ(error_of({{"temperature", -1}}), "gc.json: temperature: expected a number >= 0, found -1");
  EXPECT_EQ(error_of({{"temperature", "hot"}}), "gc.json: temperature: expected a number >= 0, found \"hot\"");
  EXPECT_EQ(error_of({{"top_p", 0}}), "gc.json: top_p: expected a number in (0, 1], found 0");
  EXPECT_EQ(error_of({{"top_p", 1.2}}), "gc.json: top_p: expected a number in (0, 1], found 1.2");
  EXPECT_EQ(error_of({{"top_k", 2.5}}), "gc.json: top_k: expected an integer >= 0, found 2.5");
  EXPECT_EQ(error_of({{"do_sample", 1}}), "gc.json: do_sample: expected true or false, found 1");
  EXPECT_EQ(error_of({{"eos_token_id", "x"}}), "gc.json: eos_token_id: expected a token id (integer >= 0), found \"x\"");
  EXPECT_EQ(error_of({{"eos_token_id", {1, -3}}}),
            "gc.json: eos_token_id[1]: expected a token id (integer >= 0), found -3");
}

TEST(GenerationConfig, FileOrConfigJsonFallback) {
  const fs::path dir = fs::temp_directory_path() / ("mt_gencfg_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const json config = {{"eos_token_id", 7}};
  // No generation_config.json: config.json's EOS.
  auto g = generation_config_read(dir.string(), config);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{7}));
  EXPECT_FALSE(g.top_p.has_value());
  // The file's EOS wins; without one in the file, config.json's is used.
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [3, 4], "top_p": 0.5})";
  g = generation_config_read(dir.string(), config);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(g.top_p, 0.5);
  std::ofstream(dir / "generation_config.json") << R"({"top_k": 5})";
  g = generation_config_read(dir.string(), config);
  EXPECT_EQ(g.eos_token_ids, (std::vector<int64_t>{7}));
  EXPECT_EQ(g.top_k, 5);
  std::ofstream(dir / "generation_config.json") << R"({"top_k": 5,)";
  try {
    generation_config_read(dir.string(), config);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "generation_config.json").string() + ": invalid JSON"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mt
