// The `mixtune` binary end to end: init → inspect → score → convert, and that bad input gives one
// line on stderr naming the file and field, exit code 1, and no output directory left behind.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "cli_process.h"

namespace {

namespace fs = std::filesystem;

using mt::test::RunResult;
RunResult run(const std::string& args) { return mt::test::run_capture(args); }

void write(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("mt_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

void expect_one_line_error(const RunResult& r, const std::string& must_contain) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("mixtune: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(must_contain), std::string::npos) << r.err;
}

TEST_F(Cli, InitInspectScoreConvert) {
  const fs::path model = dir / "model";
  RunResult r = run("init --preset qwen3-moe-test --seed 3 " + model.string());
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(fs::exists(model / "config.json"));
  r = run("inspect --json " + model.string());
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "Qwen3MoeForCausalLM");
  EXPECT_EQ(j["layers"], 2);
  EXPECT_EQ(j["experts"], 8);
  // One entry per attention / MoE configuration, with the layers using it.
  ASSERT_EQ(j["attention"].size(), 1u);
  EXPECT_EQ(j["attention"][0]["layers"], nlohmann::json({0, 1}));
  EXPECT_EQ(j["attention"][0]["heads"], 4);
  EXPECT_EQ(j["attention"][0]["kv_heads"], 2);
  EXPECT_EQ(j["attention"][0]["head_dim"], 16);
  ASSERT_EQ(j["moe"].size(), 1u);
  EXPECT_EQ(j["moe"][0]["layers"], nlohmann::json({0, 1}));
  EXPECT_EQ(j["moe"][0]["expert_intermediate_size"], 32);
  // 512·64·2 (untied) + 64 + 2·(attention 64·64·2 + 64·32·2 + 2·16 + 2·64, router 8·64, experts 8·3·64·32)
  const int64_t attn = 64 * 64 * 2 + 64 * 32 * 2 + 2 * 16 + 2 * 64;
  const int64_t total = 512 * 64 * 2 + 64 + 2 * (attn + 8 * 64 + 8 * 3 * 64 * 32);
  EXPECT_EQ(j["parameters"]["total"], total);
  EXPECT_EQ(j["parameters"]["active_per_token"], total - 2 * 6 * 3 * 64 * 32);

  write(dir / "data.jsonl",
        "{\"input_ids\": [1, 5, 9, 200, 7], \"labels\": [-100, 5, 9, 200, 7]}\n"
        "{\"input_ids\": [3, 4, 5, 6, 7]}\n");
  r = run("score --model " + model.string() + " --data " + (dir / "data.jsonl").string() + " --logits " +
          (dir / "logits.npy").string());
  ASSERT_EQ(r.code, 0) << r.err;
  auto s = nlohmann::json::parse(r.out);
  EXPECT_EQ(s["tokens"], 4 + 4);  // labels shifted inside: 4 targets per row
  // A random model predicts close to uniformly: loss near ln(512) = 6.238.
  EXPECT_NEAR(s["ce_loss"].get<double>(), 6.238, 0.3);
  EXPECT_EQ(fs::file_size(dir / "logits.npy"), 128u + 2 * 5 * 512 * 4);

  r = run("convert --in " + model.string() + " --out " + (dir / "bf16").string() + " --dtype bfloat16");
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("score --model " + (dir / "bf16").string() + " --data " + (dir / "data.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.err;
  auto s16 = nlohmann::json::parse(r.out);
  EXPECT_EQ(s16["dtype"], "bfloat16");
  EXPECT_NEAR(s16["loss"].get<double>(), s["loss"].get<double>(), 1e-2 * s["loss"].get<double>());
}

// The memory plan dry run needs no GPU: the full 48-layer Qwen3-30B-A3B does not fit one H200 with bf16 state
// (227 GiB of parameters and state alone), and fits one of 8 expert-parallel H200s at seq 4096.
TEST_F(Cli, BenchPlanOnlyDryRun) {
  RunResult one = run("bench --plan-only --preset qwen3-30b-a3b --seq 4096");
  EXPECT_EQ(one.code, 1) << one.out << one.err;
  EXPECT_NE(one.out.find("memory plan: 48 layers (48 MoE)"), std::string::npos) << one.out;
  EXPECT_NE(one.err.find("does not fit"), std::string::npos) << one.err;
  RunResult eight = run("bench --plan-only --preset qwen3-30b-a3b --seq 4096 --ep 8 --recompute selective");
  EXPECT_EQ(eight.code, 0) << eight.out << eight.err;
  EXPECT_NE(eight.out.find("on this rank (experts split over 8 ranks)"), std::string::npos) << eight.out;
  EXPECT_NE(eight.out.find("fits: largest micro_batch"), std::string::npos) << eight.out;
  // Sixteen ranks in groups of 8: two replicas of each expert group share the experts' optimizer state.
  RunResult sixteen =
      run("bench --plan-only --preset qwen3-30b-a3b --seq 4096 --ep 8 --ranks 16 --recompute selective");
  EXPECT_EQ(sixteen.code, 0) << sixteen.out << sixteen.err;
  EXPECT_NE(sixteen.out.find("1/16 (experts 1/2)"), std::string::npos) << sixteen.out;
  EXPECT_EQ(eight.out.find("(experts 1/"), std::string::npos) << eight.out;
  RunResult uneven = run("bench --plan-only --preset qwen3-30b-a3b --ep 8 --ranks 12");
  EXPECT_EQ(uneven.code, 1);
  EXPECT_NE(uneven.err.find("--ranks 12 must be a positive multiple of --ep 8"), std::string::npos) << uneven.err;
  RunResult bad = run("bench --plan-only --preset qwen3-30b-a3b --ep 3");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("--ep 3 must be >= 1 and divide the model's 128 experts"), std::string::npos) << bad.err;
  for (const char* f : {"1", "-0.5", "nan"}) {
    RunResult prompt = run(std::string("bench --plan-only --preset qwen3-30b-a3b --prompt-fraction ") + f);
    EXPECT_EQ(prompt.code, 1) << f;
    EXPECT_NE(prompt.err.find("--prompt-fraction must be in [0, 1)"), std::string::npos) << f << ": " << prompt.err;
  }
}

// Every registered preset is a bench preset: the help lists the registry's, and GPT-OSS plans without a GPU. A
// 5-layer gpt-oss-20b slice (the side-by-side's, 5.27 B parameters) fits an 80 GB H100; its FLOPs per token are
// bench/hf_baseline.py --family gpt-oss --print-flops --layers 5 --seq 4096's (the sliding layers count their
// 128-key window only).
TEST_F(Cli, BenchPresetsComeFromTheRegistryAndGptOssPlans) {
  RunResult help = run("bench --help");
  EXPECT_EQ(help.code, 0) << help.err;
  for (const char* p : {"qwen3-30b-a3b", "qwen3-moe-test", "gpt-oss-20b", "gpt-oss-120b"})
    EXPECT_NE(help.out.find(p), std::string::npos) << p << "\n" << help.out;
  RunResult oss = run("bench --plan-only --preset gpt-oss-20b --layers 5 --seq 4096 --device-gib 79.1");
  EXPECT_EQ(oss.code, 0) << oss.out << oss.err;
  EXPECT_NE(oss.out.find("memory plan: 5 layers (5 MoE), 5.27 B parameters"), std::string::npos) << oss.out;
  EXPECT_NE(oss.out.find("model FLOPs per token at seq 4096 (training: 3 x forward; router, norms and biases "
                         "excluded): 7476953088\n"),
            std::string::npos)
      << oss.out;
  RunResult big = run("bench --plan-only --preset gpt-oss-120b --seq 4096");
  EXPECT_NE(big.out.find("memory plan: 36 layers (36 MoE)"), std::string::npos) << big.out << big.err;
}

TEST_F(Cli, BadInputIsOneLineExitOneAndNoPartialOutput) {
  const fs::path model = dir / "model";
  ASSERT_EQ(run("init --preset qwen3-moe-test " + model.string()).code, 0);
  // Unknown architecture.
  fs::copy(model, dir / "arch", fs::copy_options::recursive);
  {
    std::ifstream f(dir / "arch/config.json");
    auto c = nlohmann::json::parse(f);
    c["architectures"] = {"LlamaForCausalLM"};
    write(dir / "arch/config.json", c.dump());
  }
  RunResult r = run("convert --in " + (dir / "arch").string() + " --out " + (dir / "out1").string());
  expect_one_line_error(r, "LlamaForCausalLM");
  EXPECT_NE(r.err.find("Qwen3MoeForCausalLM"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir / "out1"));
  // top-k larger than the number of experts.
  fs::copy(model, dir / "topk", fs::copy_options::recursive);
  {
    std::ifstream f(dir / "topk/config.json");
    auto c = nlohmann::json::parse(f);
    c["num_experts_per_tok"] = 9;
    write(dir / "topk/config.json", c.dump());
  }
  expect_one_line_error(run("score --model " + (dir / "topk").string() + " --data x"), "num_experts_per_tok");
  // A truncated shard.
  fs::copy(model, dir / "trunc", fs::copy_options::recursive);
  const fs::path shard = dir / "trunc/model.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  r = run("convert --in " + (dir / "trunc").string() + " --out " + (dir / "out2").string());
  expect_one_line_error(r, "model.safetensors");
  EXPECT_FALSE(fs::exists(dir / "out2"));
  // A bad data line names the file, the line and the field.
  write(dir / "bad.jsonl", "{\"input_ids\": [1, 2, 3]}\n{\"input_ids\": [1, 2, 99999]}\n");
  r = run("score --model " + model.string() + " --data " + (dir / "bad.jsonl").string());
  expect_one_line_error(r, "bad.jsonl:2: field 'input_ids'");
  // Unknown preset lists the valid ones.
  expect_one_line_error(run("init --preset nope " + (dir / "x").string()), "qwen3-30b-a3b");
  // A missing model directory.
  expect_one_line_error(run("inspect " + (dir / "missing").string()), "missing");
}

}  // namespace
