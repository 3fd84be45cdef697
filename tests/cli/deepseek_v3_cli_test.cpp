// DeepSeek-V3 through the `mixtune` binary on the CPU (tests/fixtures/deepseek_v3): inspect describes the MLA /
// sigmoid-router / shared-expert model, score gives Transformers' fp32 loss, finetune reproduces Transformers' five
// AdamW steps on two packed documents (losses rel 1e-4, final weights abs 1e-4, as tests/train/trainer_test.cpp
// does for Qwen3-MoE), convert dequantises the FP8 checkpoint, bench --plan-only plans the presets, and generate runs
// the MLA decode cache (greedy ids equal the library's generate(), which tests/models/deepseek_v3_generate_test.cpp
// holds to Transformers' goldens; seeded sampling reproducible).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

const std::string kFixtures = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/deepseek_v3/";

RunResult run(const std::string& args) { return mt::test::run_capture(args); }

class DeepseekV3Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("mt_dsv3_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

TEST_F(DeepseekV3Cli, InspectDescribesTheModel) {
  RunResult r = run("inspect --json " + kFixtures + "mla_yarn_dense1/ckpt");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "DeepseekV3ForCausalLM");
  EXPECT_EQ(j["dense_layers"], 1);
  EXPECT_EQ(j["moe_layers"], 1);
  EXPECT_EQ(j["parameters"]["total"], 42976);  // Transformers' num_parameters() (meta.json)
  EXPECT_EQ(j["attention"][0]["kind"], "mla");
  EXPECT_EQ(j["attention"][0]["head_dim"], 32);
  EXPECT_EQ(j["attention"][0]["v_head_dim"], 16);
  EXPECT_EQ(j["attention"][0]["q_lora_rank"], 16);
  EXPECT_EQ(j["moe"][0]["router"], "sigmoid_group");
  EXPECT_EQ(j["moe"][0]["shared_expert_intermediate_size"], 16);
  r = run("inspect " + kFixtures + "mla_yarn_dense1/ckpt_fp8");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("MLA, 4 heads, q_lora_rank 16, kv_lora_rank 16, qk dims 24+8, v_head_dim 16"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("shared expert intermediate 16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp8 e4m3, 128x128 blocks"), std::string::npos) << r.out;
}

// The fixture's plain batch, one JSONL record per row: the token-weighted mean over the rows is Transformers' loss.
TEST_F(DeepseekV3Cli, ScoreGivesTransformersLoss) {
  for (const char* variant : {"mla_yarn_dense1", "plain_q_legacy_config"}) {
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

// `mixtune finetune` on the CPU over the fixture's train.jsonl, packed into one 16-token row as Transformers'
// DataCollatorWithFlattening packed it (positions restart, each document's first label dropped), against
// Transformers' five AdamW steps. torch.optim.AdamW(model.parameters()) decays every parameter.
TEST_F(DeepseekV3Cli, FinetuneMatchesTransformersFiveSteps) {
  const fs::path recipe = dir / "recipe.yaml";
  std::ofstream(recipe) << "model: {path: " << kFixtures << "mla_yarn_dense1/ckpt, dtype: float32}\n"
                        << "data: {train: " << kFixtures << "train5/train.jsonl, seq_len: 16, pack: true}\n"
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
  EXPECT_EQ(got.shard_of, ref.shard_of);  // the source's shard layout, the buffer's shard included
  // Not trained: the selection bias is saved as loaded.
  const std::string bias = "model.layers.1.mlp.gate.e_score_correction_bias";
  const auto src = mt::test::fixture_checkpoint_read(kFixtures + "mla_yarn_dense1/ckpt");
  EXPECT_TRUE(mt::test::tensor_bytes_equal(got.tensors.at(bias), src.tensors.at(bias)));
}

TEST_F(DeepseekV3Cli, ConvertDequantisesFp8) {
  const RunResult r = run("convert --in " + kFixtures + "mla_yarn_dense1/ckpt_fp8 --out " + (dir / "bf16").string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto cfg = nlohmann::json::parse(slurp(dir / "bf16" / "config.json"));
  EXPECT_FALSE(cfg.contains("quantization_config"));
  EXPECT_EQ(cfg["dtype"], "bfloat16");
  const auto want = mt::test::fixture_tensors_read(kFixtures + "mla_yarn_dense1/ckpt_fp8_dequantized.safetensors");
  const auto got = mt::test::fixture_tensors_read((dir / "bf16" / "model.safetensors").string());
  EXPECT_EQ(got.at("model.layers.0.self_attn.kv_b_proj.weight").to_floats(),
            want.at("model.layers.0.self_attn.kv_b_proj.weight").to_floats());
}

// Both presets plan without a GPU (MLA counted as the CPU block keeps it); DeepSeek-V3 at full size does not fit one
// GPU, one layer of it does.
TEST_F(DeepseekV3Cli, BenchPlansThePresets) {
  RunResult help = run("bench --help");
  for (const char* p : {"deepseek-v3", "moonlight-16b-a3b"}) EXPECT_NE(help.out.find(p), std::string::npos) << p;
  RunResult moon = run("bench --plan-only --preset moonlight-16b-a3b --layers 4 --seq 4096 --device-gib 139");
  EXPECT_EQ(moon.code, 0) << moon.out << moon.err;
  EXPECT_NE(moon.out.find("memory plan: 4 layers (3 MoE)"), std::string::npos) << moon.out;
  RunResult v3 = run("bench --plan-only --preset deepseek-v3 --seq 4096");
  EXPECT_EQ(v3.code, 1) << v3.out << v3.err;
  EXPECT_NE(v3.out.find("memory plan: 61 layers (58 MoE)"), std::string::npos) << v3.out;
  EXPECT_NE(v3.err.find("does not fit"), std::string::npos) << v3.err;
}

// The side-by-side slices of issue 40 (bench/side_by_side.sh moonlight, dsv3) on an 80 GB H100 (79.1 GiB): Moonlight's
// first 10 layers (1 dense + 9 MoE) and DeepSeek-V3's three dense layers fit; V3's fourth layer, its first MoE layer
// (11.3 B parameters), does not. Their FLOPs per token, counted here by hand from the shapes (MLA's five projections
// and the scores at qk 192 / v 128 over S/2 keys, SwiGLU MLPs, routed top-k + shared experts, the LM head; router
// left out), are what bench/hf_baseline.py --family moonlight|deepseek-v3 --print-flops prints for the same slice.
TEST_F(DeepseekV3Cli, BenchPlansTheSideBySideSlices) {
  const double S = 4096;
  auto mla = [&](double H, double Hq, double q_lora) {
    const double D = 192, Dv = 128, kv_lora = 512, rope = 64, nope = 128;
    const double q = q_lora > 0 ? H * q_lora + q_lora * Hq * D : H * Hq * D;
    return 2.0 * (q + H * (kv_lora + rope) + kv_lora * Hq * (nope + Dv) + Hq * Dv * H) + 2.0 * (S / 2) * Hq * (D + Dv);
  };
  auto swiglu = [](double H, double I) { return 2.0 * 3 * H * I; };
  const double moon = 3 * (2.0 * 163840 * 2048 + 10 * mla(2048, 16, 0) + swiglu(2048, 11264) +
                           9 * (6 + 2) * swiglu(2048, 1408));
  const double v3 = 3 * (2.0 * 129280 * 7168 + 3 * mla(7168, 128, 1536) + 3 * swiglu(7168, 18432));
  auto flops_line = [](double f) {
    return "model FLOPs per token at seq 4096 (training: 3 x forward; router, norms and biases excluded): " +
           std::to_string(static_cast<long long>(f)) + "\n";
  };
  RunResult m = run("bench --plan-only --preset moonlight-16b-a3b --layers 10 --seq 4096 --device-gib 79.1");
  EXPECT_EQ(m.code, 0) << m.out << m.err;
  EXPECT_NE(m.out.find("memory plan: 10 layers (9 MoE), 6.02 B parameters"), std::string::npos) << m.out;
  EXPECT_NE(m.out.find(flops_line(moon)), std::string::npos) << m.out;
  RunResult d = run("bench --plan-only --preset deepseek-v3 --layers 3 --seq 4096 --device-gib 79.1");
  EXPECT_EQ(d.code, 0) << d.out << d.err;
  EXPECT_NE(d.out.find("memory plan: 3 layers (0 MoE), 3.60 B parameters"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find(flops_line(v3)), std::string::npos) << d.out;
  RunResult moe = run("bench --plan-only --preset deepseek-v3 --layers 4 --seq 4096 --device-gib 79.1");
  EXPECT_EQ(moe.code, 1) << moe.out << moe.err;
  EXPECT_NE(moe.out.find("memory plan: 4 layers (1 MoE), 15.11 B parameters"), std::string::npos) << moe.out;
  EXPECT_NE(moe.err.find("does not fit"), std::string::npos) << moe.err;
}

TEST_F(DeepseekV3Cli, GenerateRunsTheMlaDecodeCache) {
  fs::create_directories(dir / "tok");
  std::ofstream(dir / "tok" / "tokenizer.json") << mt::test::byte_tokenizer_json();
  const std::string base =
      "generate --model " + kFixtures + "mla_yarn_dense1/ckpt --tokenizer " + (dir / "tok").string() + " --json ";
  RunResult r = run(base + "--prompt abc --max-new-tokens 6 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], 3);
  mt::CausalLM lm = mt::CausalLM::from_pretrained(kFixtures + "mla_yarn_dense1/ckpt");
  mt::GenerateOptions o;
  o.max_new_tokens = 6;
  o.sampling.temperature = 0;
  o.eos_token_ids = {2};
  const mt::GenerateResult want = mt::generate(lm.config, lm.weights, {'a', 'b', 'c'}, o);  // byte ids
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

}  // namespace
