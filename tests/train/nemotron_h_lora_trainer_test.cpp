// LoRA training of Nemotron-H on the CPU (issue 39) on the hybrid_all_kinds fixture (layers M E M * E -): a recipe
// whose peft targets are the Mamba2 mixer's in_proj, the ReLU² MLP and shared expert's up/down, the experts
// and the router trains; only the adapter and the routers move, every other base byte stays as loaded; the adapter
// saved in final/ has trained (non-zero) B on the Mamba2 in_proj. The trainer's GPU check (run without a GPU)
// takes every Nemotron-H target, the Mamba2 in_proj included, and still refuses an expert rank not a multiple of 8.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "../io/io_test_util.h"
#include "../models/lora_test_util.h"
#include "core/error.h"
#include "models/causal_lm.h"
#include "models/lora_checkpoint.h"
#include "train/lora_engine.h"
#include "train/recipe.h"
#include "train/trainer.h"
#include "train_test_util.h"

namespace fs = std::filesystem;

namespace mt {
namespace {

const std::string kCkpt = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/nemotron_h/hybrid_all_kinds/ckpt";
// Pre-tokenised rows, ids below 117: inside this fixture's vocabulary of 128 too.
const std::string kData = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/train5/train.jsonl";

Recipe nemotron_lora_recipe(const io_test::ScratchDir& dir, const std::vector<std::string>& sets) {
  const std::string path = dir.file("recipe.yaml");
  std::ofstream(path) << "model: {path: " << kCkpt << ", dtype: float32}\n"
                      << "data: {train: " << kData << ", seq_len: 16, pack: false}\n"
                      << "train: {micro_batch_size: 1, grad_accum: 2, max_steps: 2, seed: 7, device: cpu}\n"
                      << "optimizer: {lr: 1.0e-2, weight_decay: 0.01}\n"
                      << "clip: {max_grad_norm: 1.0}\n"
                      << "checkpoint: {dir: " << dir.file("run") << "}\n"
                      << "peft: {r: 4, alpha: 8, target: [in_proj, up_proj, down_proj, experts, router]}\n";
  return recipe_load(path, sets);
}

TEST(NemotronHLoraTrainer, TwoStepsTrainTheMambaProjectionsAdapterOnly) {
  io_test::ScratchDir d;
  test::QuietLog q;
  const FinetuneResult r = finetune(nemotron_lora_recipe(d, {}), q.options());
  ASSERT_EQ(r.steps, 2);
  const fs::path fin = d.path / "run" / "final";
  ASSERT_TRUE(fs::is_regular_file(fin / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(fin / "model.safetensors"));
  LoadOptions lo;
  lo.dtype = DType::F32;
  CausalLM base = CausalLM::from_pretrained(kCkpt, lo);
  const LoraWeights l = lora_load_pretrained(fin.string(), base.config, base.weights);
  // B starts at zero (PEFT's init): non-zero after two steps on every Mamba2 layer's in_proj.
  int mamba_b_trained = 0;
  for (const LoraEntry& e : l.table->entries) {
    if (!e.is_b || e.target != "in_proj") continue;
    bool nonzero = false;
    for (float v : l.slot(e).to_floats()) nonzero = nonzero || v != 0;
    EXPECT_TRUE(nonzero) << e.name;
    mamba_b_trained += nonzero;
  }
  EXPECT_EQ(mamba_b_trained, 2);  // layers 0 and 2
}

// The engine alone: after two steps only the adapter and the full-trained routers moved.
TEST(NemotronHLoraTrainer, OnlyAdapterAndRoutersChange) {
  io_test::ScratchDir d;
  const Recipe r = nemotron_lora_recipe(d, {});
  LoadOptions lo;
  lo.dtype = DType::F32;
  CausalLM lm = CausalLM::from_pretrained(r.model.path, lo);
  std::vector<std::pair<std::string, std::vector<float>>> before;
  for (const auto& [n, t] : lm.weights.named_parameters()) before.emplace_back(n, t->to_floats());
  auto engine = cpu_lora_engine_create(lm, r, lora_adapter_for_run(r, lm, ""));
  const Batch b = test::batch_of(lm.config);
  for (int i = 0; i < 2; ++i) engine->step({b}, 1.0 * b.labels.numel(), 1e-2, 1.0);
  int routers_changed = 0;
  const auto after = lm.weights.named_parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    const bool router = after[i].first.find("mixer.gate.weight") != std::string::npos;
    const bool same = after[i].second->to_floats() == before[i].second;
    if (router)
      routers_changed += !same;
    else
      EXPECT_TRUE(same) << after[i].first << " changed";
  }
  EXPECT_EQ(routers_changed, 2);  // layers 1 and 4
  int adapters_moved = 0;
  for (const auto& [n, t] : engine->lora()->named_parameters()) {
    if (n.find("lora_B") == std::string::npos) continue;
    bool nonzero = false;
    for (float v : t->to_floats()) nonzero = nonzero || v != 0;
    adapters_moved += nonzero;
  }
  EXPECT_EQ(adapters_moved, static_cast<int>(engine->lora()->table->entries.size() / 2));
}

// The CUDA blocks apply every target (layers/cuda/mamba2_mixer_block_cuda.h: in_proj); what is left refused is
// r % 8 != 0 on the expert stacks (the recipe's r is 4).
TEST(NemotronHLoraTrainer, CudaTakesTheMambaProjections) {
  io_test::ScratchDir d;
  const DecoderSpec spec = DecoderSpec::from_file(kCkpt + "/config.json");
  EXPECT_EQ(lora_gpu_unsupported(nemotron_lora_recipe(d, {"peft.r=8"}), spec, ""), "");
  EXPECT_EQ(lora_gpu_unsupported(nemotron_lora_recipe(d, {"peft.target=[in_proj]"}), spec, ""), "");
  EXPECT_EQ(lora_gpu_unsupported(nemotron_lora_recipe(d, {}), spec, ""),
            "peft.r 4 on expert stacks is not a multiple of 8, which the GPU's grouped GEMMs need (their 16-byte "
            "rows); use 8, 16, 32, ...");
}

}  // namespace
}  // namespace mt
