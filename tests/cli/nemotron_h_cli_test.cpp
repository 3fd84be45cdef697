// Nemotron-H through the `mixtune` binary on the CPU (tests/fixtures/nemotron_h): inspect describes the hybrid model,
// score gives Transformers' fp32 loss, finetune reproduces Transformers' five AdamW steps on one sequence (losses rel
// 1e-4, final weights abs 1e-4), generate runs the Mamba2 decode cache (greedy ids equal the library's generate(),
// which tests/models/nemotron_h_generate_test.cpp holds to Transformers' goldens), and bench --plan-only plans the
// hybrid model.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "../train/fixture_tensors.h"
#include "../train/train_test_util.h"
#include "byte_tokenizer.h"
#include "cli_process.h"
#include "models/causal_lm.h"
#include "models/generate.h"

namespace {

namespace fs = std::filesystem;
using mt::test::RunResult;
using mt::test::slurp;

const std::string kFixtures = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/nemotron_h/";

RunResult run(const std::string& args) { return mt::test::run_capture(args); }

class NemotronHCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kFixtures)) GTEST_SKIP() << kFixtures << " is absent (tests/fixtures/README.md)";
    dir = fs::temp_directory_path() / ("mt_nemh_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override {
    if (!dir.empty()) fs::remove_all(dir);
  }
  fs::path dir;
};

TEST_F(NemotronHCli, InspectDescribesTheModel) {
  RunResult r = run("inspect --json " + kFixtures + "hybrid_all_kinds/ckpt");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "NemotronHForCausalLM");
  EXPECT_EQ(j["layers"], 6);
  EXPECT_EQ(j["moe_layers"], 2);
  EXPECT_EQ(j["dense_layers"], 1);
  EXPECT_EQ(j["mamba2_layers"], 2);
  EXPECT_EQ(j["attention_only_layers"], 1);
  // Transformers' num_parameters() (meta.json)
  EXPECT_EQ(j["parameters"]["total"],
            nlohmann::json::parse(slurp(kFixtures + "hybrid_all_kinds/meta.json"))["hf"]["parameters"]);
  ASSERT_EQ(j["mamba2"].size(), 1u);
  EXPECT_EQ(j["mamba2"][0]["layers"], nlohmann::json({0, 2}));
  EXPECT_EQ(j["mamba2"][0]["heads"], 4);
  EXPECT_EQ(j["mamba2"][0]["state"], 16);
  EXPECT_EQ(j["mamba2"][0]["groups"], 2);
  EXPECT_EQ(j["attention"][0]["layers"], nlohmann::json({3}));
  EXPECT_EQ(j["moe"][0]["router"], "sigmoid_group");
  EXPECT_EQ(j["moe"][0]["shared_expert_intermediate_size"], 32);
  r = run("inspect " + kFixtures + "one_group_dt_clamp_pattern/ckpt");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("mamba2         layers 1, 3: 4 heads x 16, state 16, 1 group(s), conv 4, chunk 8"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("no RoPE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 (1 MoE, 0 dense, 2 Mamba2, 1 attention only)"), std::string::npos) << r.out;
}

// The fixture's plain batch, one JSONL record per row: the token-weighted mean over the rows is Transformers' loss.
TEST_F(NemotronHCli, ScoreGivesTransformersLoss) {
  for (const char* variant : {"hybrid_all_kinds", "one_group_dt_clamp_pattern"}) {
    SCOPED_TRACE(variant);
    mt::test::write_batch_jsonl(mt::test::fixture_tensors_read(kFixtures + variant + "/plain.safetensors"),
                                (dir / "plain.jsonl").string());
    const RunResult r = run("score --model " + kFixtures + variant + "/ckpt --data " + (dir / "plain.jsonl").string());
    ASSERT_EQ(r.code, 0) << r.err;
    const auto s = nlohmann::json::parse(r.out);
    const auto meta = nlohmann::json::parse(slurp(kFixtures + variant + "/meta.json"))["batches"]["plain"]["fp32"];
    EXPECT_EQ(s["tokens"], meta["tokens"]);
    EXPECT_NEAR(s["loss"].get<double>(), meta["loss"].get<double>(), 1e-5 * meta["loss"].get<double>());
    EXPECT_EQ(s["aux_loss"], 0.0);
  }
}

// `mixtune finetune` on the CPU over the fixture's train.jsonl (one 40-token sequence) against Transformers' five
// AdamW steps. torch.optim.AdamW(model.parameters()) decays every parameter.
TEST_F(NemotronHCli, FinetuneMatchesTransformersFiveSteps) {
  const fs::path recipe = dir / "recipe.yaml";
  std::ofstream(recipe) << "model: {path: " << kFixtures << "hybrid_all_kinds/ckpt, dtype: float32}\n"
                        << "data: {train: " << kFixtures << "train5/train.jsonl, seq_len: 40, pack: true}\n"
                        << "train: {device: cpu, micro_batch_size: 1, grad_accum: 1, max_steps: 5, seed: 7}\n"
                        << "optimizer: {lr: 1.0e-3, betas: [0.9, 0.95], eps: 1.0e-8, weight_decay: 0.01, "
                           "decay_norms_and_biases: true}\n"
                        << "schedule: {name: constant}\n"
                        << "clip: {max_grad_norm: 0}\n"
                        << "checkpoint: {dir: " << (dir / "run").string() << "}\n";
  ASSERT_EQ(mt::test::run_mixtune({"finetune", recipe.string()}, dir / "log"), 0) << slurp(dir / "log");
  const auto meta = nlohmann::json::parse(slurp(kFixtures + "train5/meta.json"));
  const auto m = mt::test::metrics_of(dir / "run");
  ASSERT_EQ(m.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const double got = m[i]["loss"].get<double>(), want = meta["steps"][i]["loss"].get<double>();
    EXPECT_LE(std::fabs(got - want), 1e-4 * want) << "step " << i + 1;
    EXPECT_EQ(m[i]["trained_tokens"], meta["steps"][i]["tokens"]) << "step " << i + 1;
  }
  const auto ref = mt::test::fixture_checkpoint_read(kFixtures + "train5/final");
  const auto got = mt::test::fixture_checkpoint_read((dir / "run" / "final").string());
  EXPECT_LE(mt::test::max_abs_checkpoint_diff(got, ref), 1e-4);
  EXPECT_EQ(got.shard_of, ref.shard_of);  // the source's shard layout (backbone. names, per-expert tensors)
  // Not trained: the selection bias is saved as loaded.
  const std::string bias = "backbone.layers.1.mixer.gate.e_score_correction_bias";
  const auto src = mt::test::fixture_checkpoint_read(kFixtures + "hybrid_all_kinds/ckpt");
  EXPECT_TRUE(mt::test::tensor_bytes_equal(got.tensors.at(bias), src.tensors.at(bias)));
}

TEST_F(NemotronHCli, GenerateRunsTheMamba2DecodeCache) {
  fs::create_directories(dir / "tok");
  std::ofstream(dir / "tok" / "tokenizer.json") << mt::test::byte_tokenizer_json();
  const std::string base =
      "generate --model " + kFixtures + "hybrid_all_kinds/ckpt --tokenizer " + (dir / "tok").string() + " --json ";
  RunResult r = run(base + "--prompt abcdefghijk --max-new-tokens 6 --temperature 0");  // 11 tokens: two chunks
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], 11);
  mt::CausalLM lm = mt::CausalLM::from_pretrained(kFixtures + "hybrid_all_kinds/ckpt");
  mt::GenerateOptions o;
  o.max_new_tokens = 6;
  o.sampling.temperature = 0;
  o.eos_token_ids = {2};  // generation_config.json
  std::vector<int64_t> prompt;
  for (char ch = 'a'; ch <= 'k'; ++ch) prompt.push_back(ch);  // byte ids
  const mt::GenerateResult want = mt::generate(lm.config, lm.weights, prompt, o);
  EXPECT_EQ(j["generated_ids"].get<std::vector<int64_t>>(), want.ids);
  EXPECT_EQ(j["stop_reason"], want.stop_reason);

  // Sampled: the same seed gives the same tokens, another seed others.
  const std::string sampled = base + "--prompt abc --max-new-tokens 12 --temperature 1.5 --seed ";
  r = run(sampled + "3");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto s3 = nlohmann::json::parse(r.out)["generated_ids"];
  EXPECT_EQ(nlohmann::json::parse(run(sampled + "3").out)["generated_ids"], s3);
  EXPECT_NE(nlohmann::json::parse(run(sampled + "4").out)["generated_ids"], s3);
}

// The memory plan counts the Mamba2 mixers (layers/costs/mamba2_cost.h): 6 layers of the real shapes (M E M E M *)
// fit one GPU, and dropping the mixers' cheap tensors (selective) plans less than keeping them (none).
TEST_F(NemotronHCli, BenchPlanOnlyCountsTheMamba2Layers) {
  const RunResult none =
      run("bench --plan-only --preset nemotron-3-nano-30b-a3b --layers 6 --seq 4096 --recompute none");
  ASSERT_EQ(none.code, 0) << none.out << none.err;
  EXPECT_NE(none.out.find("model FLOPs per token"), std::string::npos) << none.out;
  const RunResult selective =
      run("bench --plan-only --preset nemotron-3-nano-30b-a3b --layers 6 --seq 4096 --recompute selective");
  ASSERT_EQ(selective.code, 0) << selective.out << selective.err;
  EXPECT_NE(none.out, selective.out);
  RunResult help = run("bench --help");
  EXPECT_NE(help.out.find("nemotron-3-nano-30b-a3b"), std::string::npos);
}

}  // namespace
