// `mixtune merge`, `score --adapter` and `generate --adapter` end to end: the merged checkpoint is the base with
// W + s·B·A at the adapted weights (computed here in double from the adapter's PEFT file) and every other byte of
// the base's own save; score with the adapter unmerged equals score of the merged checkpoint (fp32).
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "models/causal_lm.h"
#include "models/lora_checkpoint.h"
#include "../models/lora_test_util.h"
#include "cli_process.h"

namespace mt {
namespace {

namespace fs = std::filesystem;

using mt::test::RunResult;
RunResult run(const std::string& args) { return mt::test::run_capture(args); }

using test::slurp;

class LoraCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / ("mt_lora_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

const std::string kBase = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/moe_gqa_aux/ckpt";

TEST_F(LoraCli, MergeWritesBasePlusScaledBAInTheBaseLayout) {
  CausalLM base = CausalLM::from_pretrained(kBase);
  const DecoderSpec& s = base.config;
  auto table = std::make_shared<const LoraTable>(
      lora_table_of(s, test::config_of({"q_proj", "v_proj", "experts"}, 2), "t"));
  const LoraWeights l = test::random_adapter(table, s.num_layers(), 21);
  lora_save_pretrained((dir / "adapter").string(), s, l, base.weights, kBase);
  RunResult r = run("merge --model " + kBase + " --adapter " + (dir / "adapter").string() + " --out " +
                    (dir / "merged").string());
  ASSERT_EQ(r.code, 0) << r.err;
  // The base through the same save path: same files; the weight files differ only in adapted tensors.
  r = run("convert --in " + kBase + " --out " + (dir / "plain").string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> merged_files, plain_files;
  for (const auto& e : fs::directory_iterator(dir / "merged")) merged_files.push_back(e.path().filename().string());
  for (const auto& e : fs::directory_iterator(dir / "plain")) plain_files.push_back(e.path().filename().string());
  std::sort(merged_files.begin(), merged_files.end());
  std::sort(plain_files.begin(), plain_files.end());
  EXPECT_EQ(merged_files, plain_files);
  EXPECT_EQ(slurp(dir / "merged" / "config.json"), slurp(dir / "plain" / "config.json"));

  const double sc = table->config.scaling();
  const SafetensorsFile ad = SafetensorsFile::open((dir / "adapter" / "adapter_model.safetensors").string());
  std::map<std::string, Tensor> merged, plain;
  for (const auto& e : fs::directory_iterator(dir / "merged"))
    if (e.path().extension() == ".safetensors") {
      const SafetensorsFile f = SafetensorsFile::open(e.path().string());
      for (const auto& n : f.names()) merged[n] = f.tensor(n).clone();
      const SafetensorsFile g = SafetensorsFile::open((dir / "plain" / e.path().filename()).string());
      for (const auto& n : g.names()) plain[n] = g.tensor(n).clone();
    }
  ASSERT_EQ(merged.size(), plain.size());
  int adapted = 0;
  for (const auto& [name, t] : merged) {
    const Tensor& p = plain.at(name);
    // q_proj / v_proj: W + s·B·A from the adapter file's nn.Linear tensors.
    const bool linear = name.find("q_proj.weight") != std::string::npos || name.find("v_proj.weight") != std::string::npos;
    if (!linear) {
      if (name.find("mlp.experts.") == std::string::npos) {
        EXPECT_EQ(t.to_floats(), p.to_floats()) << name << " changed";  // not adapted: the base's values
      }
      continue;
    }
    const std::string module = name.substr(0, name.size() - std::string(".weight").size());
    const auto a = ad.tensor("base_model.model." + module + ".lora_A.weight").to_floats();
    const auto b = ad.tensor("base_model.model." + module + ".lora_B.weight").to_floats();
    const int64_t out = t.dim(0), in = t.dim(1), rk = 2;
    const auto w0 = p.to_floats(), w1 = t.to_floats();
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double d = 0;
        for (int64_t j = 0; j < rk; ++j) d += double(b[o * rk + j]) * a[j * in + i];
        const double want = w0[o * in + i] + sc * d;
        ASSERT_NEAR(w1[o * in + i], want, 1e-6 * std::max(1.0, std::fabs(want))) << name;
      }
    ++adapted;
  }
  EXPECT_EQ(adapted, 2 * s.num_layers());

  // score: the adapter unmerged equals the merged checkpoint (fp32: rounding of W + s·B·A only).
  const std::string data = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/train5/train.jsonl";
  r = run("score --model " + kBase + " --adapter " + (dir / "adapter").string() + " --data " + data);
  ASSERT_EQ(r.code, 0) << r.err;
  const double unmerged = nlohmann::json::parse(r.out)["loss"].get<double>();
  r = run("score --model " + (dir / "merged").string() + " --data " + data);
  ASSERT_EQ(r.code, 0) << r.err;
  const double with_merged = nlohmann::json::parse(r.out)["loss"].get<double>();
  r = run("score --model " + kBase + " --data " + data);
  const double base_loss = nlohmann::json::parse(r.out)["loss"].get<double>();
  EXPECT_NEAR(unmerged, with_merged, 1e-5 * with_merged);
  EXPECT_GT(std::fabs(unmerged - base_loss), 1e-3);  // the adapter does change the model

  // A wrong adapter is one line naming the file.
  r = run("merge --model " + kBase + " --adapter " + (dir / "nope").string() + " --out " + (dir / "m2").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no adapter_config.json"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir / "m2"));
}

// inspect --lora-target: the adapter's size from the family's targets, and the frozen base's training state.
TEST_F(LoraCli, InspectCountsAdapterParameters) {
  const RunResult r = run("inspect " + kBase + " --json --lora-r 4 --lora-target q_proj,experts,router");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  CausalLM base = CausalLM::from_pretrained(kBase);
  const LoraTable t = lora_table_of(base.config, test::config_of({"q_proj", "experts", "router"}, 4), "t");
  // Counted independently: q_proj [nq, H] per layer, each MoE layer's two stacks [E, 2I, H], [E, H, I].
  int64_t want = 0, full = 0;
  for (const ParamEntry& e : base.weights.param_table().entries()) {
    if (e.slot == WeightSlot::q_proj) want += 4 * (e.shape[0] + e.shape[1]);
    if (e.slot == WeightSlot::experts_gate_up || e.slot == WeightSlot::experts_down)
      want += e.shape[0] * 4 * (e.shape[1] + e.shape[2]);
    if (e.slot == WeightSlot::router) full += e.shape[0] * e.shape[1];
  }
  EXPECT_EQ(j["lora"]["adapter_parameters"].get<int64_t>(), want);
  EXPECT_EQ(lora_parameter_count(t), want);
  EXPECT_EQ(j["lora"]["full_trained_parameters"].get<int64_t>(), full);
  EXPECT_EQ(j["lora"]["training_state_bytes"]["adapter_fp32_with_gradients_and_moments"].get<double>(), 16.0 * want);
  const RunResult bad = run("inspect " + kBase + " --lora-target q_proj,lm_head");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("'lm_head' is not a LoRA target"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace mt
