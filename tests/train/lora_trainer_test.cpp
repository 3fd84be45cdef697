// LoRA training end to end on the CPU (recipe `peft`, train/lora_engine): the loss falls while only the adapter
// (and a full-trained router) changes and the base bytes stay as loaded; checkpoints and final/ hold PEFT's adapter
// files, not the model; a stop and --resume is bitwise the uninterrupted run; model.adapter continues an adapter;
// what LoRA does not support yet is refused in one line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

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

const std::string kFixtures = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/";

using test::slurp;

using test::metrics_of;

Recipe lora_recipe(const io_test::ScratchDir& dir, const std::vector<std::string>& sets) {
  const std::string path = dir.file("recipe.yaml");
  std::ofstream(path) << "model: {path: " << kFixtures << "moe_gqa_aux/ckpt, dtype: bfloat16}\n"
                      << "data: {train: " << kFixtures << "train5/train.jsonl, seq_len: 16, pack: false}\n"
                      << "train: {micro_batch_size: 1, grad_accum: 2, max_steps: 8, seed: 7, device: cpu}\n"
                      << "optimizer: {lr: 2.0e-2, weight_decay: 0.01}\n"
                      << "clip: {max_grad_norm: 1.0}\n"
                      << "checkpoint: {dir: " << dir.file("run") << "}\n"
                      << "peft: {r: 4, alpha: 8, target: [q_proj, k_proj, v_proj, o_proj, experts]}\n";
  return recipe_load(path, sets);
}

TEST(LoraTrainer, LossFallsAndFinalHoldsTheAdapterOnly) {
  io_test::ScratchDir d;
  test::QuietLog q;
  const FinetuneResult r = finetune(lora_recipe(d, {}), q.options());
  ASSERT_EQ(r.steps, 8);
  const auto m = metrics_of(d.path / "run");
  ASSERT_EQ(m.size(), 8u);
  // Step 1 is the base model (B = 0); 8 AdamW steps at lr 2e-2 on 4 rows fit them.
  EXPECT_LT(m[7]["loss"].get<double>(), 0.8 * m[0]["loss"].get<double>());
  const fs::path fin = d.path / "run" / "final";
  EXPECT_TRUE(fs::is_regular_file(fin / "adapter_config.json"));
  EXPECT_TRUE(fs::is_regular_file(fin / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(fin / "config.json"));
  EXPECT_FALSE(fs::exists(fin / "model.safetensors"));
  // The saved adapter applied to the base gives a lower loss than the base.
  CausalLM base = CausalLM::from_pretrained(kFixtures + "moe_gqa_aux/ckpt", {});
  LoraWeights l = lora_load_pretrained(fin.string(), base.config, base.weights);
  bool b_nonzero = false;
  for (const auto& [n, t] : l.named_parameters())
    if (n.find("lora_B") != std::string::npos)
      for (float v : t->to_floats()) b_nonzero = b_nonzero || v != 0;
  EXPECT_TRUE(b_nonzero);
}

// The engine alone: only the adapter and the full-trained router move; every other base byte stays as loaded, and
// the base has no gradient buffers.
TEST(LoraTrainer, OnlyAdapterAndRouterChange) {
  io_test::ScratchDir d;
  Recipe r = lora_recipe(d, {"peft.target=[q_proj, experts, router]"});
  LoadOptions lo;
  lo.dtype = DType::BF16;
  CausalLM lm = CausalLM::from_pretrained(r.model.path, lo);
  std::vector<std::pair<std::string, std::vector<float>>> before;
  for (const auto& [n, t] : lm.weights.named_parameters()) before.emplace_back(n, t->to_floats());
  auto engine = cpu_lora_engine_create(lm, r, lora_adapter_for_run(r, lm, ""));
  const LoraWeights a0 = LoraWeights::zeros(engine->lora()->table, lm.config.num_layers());
  const Batch b = test::batch_of(lm.config);
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    const EngineStep s = engine->step({b}, 1.0 * b.labels.numel(), 2e-2, 1.0);
    (i == 0 ? first : last) = s.loss;
  }
  EXPECT_LT(last, first);
  int router_changed = 0;
  const auto after = lm.weights.named_parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    const bool router = after[i].first.find("mlp.gate.weight") != std::string::npos;
    const bool same = after[i].second->to_floats() == before[i].second;
    if (router)
      router_changed += !same;
    else
      EXPECT_TRUE(same) << after[i].first << " changed";
  }
  EXPECT_EQ(router_changed, 2);  // both MoE layers' routers
  // Optimizer state: the adapter's and the routers' moments only (bf16 routers: plus their fp32 masters).
  const auto state = engine->optimizer_state_host();
  const size_t adapters = engine->lora()->table->entries.size();
  EXPECT_EQ(state.size(), 2 * adapters + 3 * 2);
  for (const auto& [n, t] : state)
    EXPECT_TRUE(n.find("lora_") != std::string::npos || n.find("mlp.gate.weight") != std::string::npos) << n;
}

TEST(LoraTrainer, ResumeIsBitwiseIdentical) {
  const std::vector<std::string> sets = {"train.max_steps=6", "checkpoint.every_steps=2", "checkpoint.keep_last=1",
                                         "schedule.name=cosine", "schedule.warmup_steps=1",
                                         "peft.target=[router, o_proj, experts, q_proj]"};  // not the family order
  io_test::ScratchDir a, b;
  test::QuietLog q;
  ASSERT_EQ(finetune(lora_recipe(a, sets), q.options()).steps, 6);
  const Recipe rb = lora_recipe(b, sets);
  FinetuneOptions ob = q.options();
  int calls = 0;
  ob.stop_requested = [&] { return ++calls == 3; };
  const FinetuneResult first = finetune(rb, ob);
  EXPECT_TRUE(first.interrupted);
  const fs::path ck = b.path / "run" / "checkpoint-000003";
  EXPECT_TRUE(fs::is_regular_file(ck / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::is_regular_file(ck / "optimizer.safetensors"));
  EXPECT_FALSE(fs::exists(ck / "model.safetensors"));
  const FinetuneResult second = finetune(rb, q.options(/*resume=*/true));
  EXPECT_EQ(second.steps, 6);
  for (const char* f : {"adapter_model.safetensors", "adapter_config.json"})
    EXPECT_TRUE(slurp(a.path / "run" / "final" / f) == slurp(b.path / "run" / "final" / f)) << f << " differs";
  const auto ma = metrics_of(a.path / "run"), mb = metrics_of(b.path / "run");
  ASSERT_EQ(ma.size(), 6u);
  ASSERT_EQ(mb.size(), 6u);
  for (size_t i = 0; i < 6; ++i)
    for (const char* k : {"loss", "grad_norm", "lr"}) EXPECT_EQ(ma[i][k], mb[i][k]) << "step " << i + 1 << " " << k;
  // A resume with other LoRA settings is refused.
  EXPECT_THROW(finetune(lora_recipe(b, {"train.max_steps=8", "peft.r=8", "peft.target=[q_proj, o_proj, experts, router]"}),
                        q.options(true)),
               Error);
}

TEST(LoraTrainer, ContinuesASavedAdapter) {
  io_test::ScratchDir a, b;
  test::QuietLog q;
  ASSERT_EQ(finetune(lora_recipe(a, {"train.max_steps=6"}), q.options()).steps, 6);
  const std::string saved = (a.path / "run" / "final").string();
  // No peft targets in the recipe: the adapter's config gives them.
  const Recipe r = lora_recipe(b, {"train.max_steps=1", "model.adapter=" + saved, "peft.target=null"});
  ASSERT_EQ(finetune(r, q.options()).steps, 1);
  const auto ma = metrics_of(a.path / "run"), mb = metrics_of(b.path / "run");
  // The continued run starts where the saved adapter is: below the base model's first loss.
  EXPECT_LT(mb[0]["loss"].get<double>(), 0.9 * ma[0]["loss"].get<double>());
  // Settings that disagree with the adapter's are named.
  try {
    finetune(lora_recipe(b, {"model.adapter=" + saved, "peft.r=8", "checkpoint.dir=" + b.file("run2")}), q.options());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("peft.r: 8 in the recipe, 4 in the adapter"), std::string::npos) << e.what();
  }
}

TEST(LoraTrainer, RefusalsAreOneLine) {
  io_test::ScratchDir d;
  test::QuietLog q;
  auto err = [&](const std::vector<std::string>& sets) {
    try {
      finetune(lora_recipe(d, sets), q.options());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string file = d.file("recipe.yaml");
  EXPECT_EQ(err({"parallel.ep=2"}), file + ": parallel.ep: LoRA training does not support expert parallelism yet");
  EXPECT_EQ(err({"peft.target=[q_proj, lm_head]"}),
            file + ": peft.target: 'lm_head' is not a LoRA target of qwen3_moe models (known: q_proj, k_proj, v_proj, "
                   "o_proj, gate_proj, up_proj, down_proj, experts, router)");
}

// What the GPU cannot train (r not a multiple of 8 on an expert stack), found from the recipe or a saved adapter's
// config before any loading (the trainer refuses it on train.device cuda, and auto takes the CPU).
TEST(LoraTrainer, GpuUnsupportedNamesAnExpertRankNotAMultipleOf8) {
  io_test::ScratchDir d;
  const DecoderSpec spec = DecoderSpec::from_file(kFixtures + "moe_gqa_aux/ckpt/config.json");
  const std::string why = "peft.r 4 on expert stacks is not a multiple of 8, which the GPU's grouped GEMMs need (their "
                          "16-byte rows); use 8, 16, 32, ...";
  EXPECT_EQ(lora_gpu_unsupported(lora_recipe(d, {}), spec, ""), why);
  EXPECT_EQ(lora_gpu_unsupported(lora_recipe(d, {"peft.r=8"}), spec, ""), "");
  EXPECT_EQ(lora_gpu_unsupported(lora_recipe(d, {"peft.target=[q_proj, o_proj, router]"}), spec, ""), "");
  // A saved adapter's settings (resume or model.adapter) decide when there is one.
  test::QuietLog q;
  ASSERT_EQ(finetune(lora_recipe(d, {"train.max_steps=1"}), q.options()).steps, 1);
  const std::string saved = (d.path / "run" / "final").string();
  EXPECT_EQ(lora_gpu_unsupported(lora_recipe(d, {"peft.r=8"}), spec, saved), why);
  EXPECT_EQ(lora_gpu_unsupported(lora_recipe(d, {"model.adapter=" + saved, "peft.target=null"}), spec, ""), why);
}

}  // namespace
}  // namespace mt
