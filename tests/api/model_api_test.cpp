// The public API (include/mixtune/mixtune.h) against Transformers' and PEFT's fixtures: a packed row scored with its
// position_ids, a PEFT adapter attached unmerged and then merged, the memory plan, and errors as mixtune::Error.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "../io/io_test_util.h"
#include "../models/hf_fixture_util.h"
#include "mixtune/mixtune.h"

namespace {

const std::string kFixtures = std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/";
const std::string kBase = kFixtures + "qwen3_moe/moe_gqa_aux/ckpt";

std::vector<int64_t> ids_of(const mt::Tensor& t) {
  const int64_t* p = t.data_as<int64_t>();
  return std::vector<int64_t>(p, p + t.numel());
}

// A fixture batch file's rows as API sequences.
std::vector<mixtune::Sequence> sequences_of(const std::string& file) {
  const mt::SafetensorsFile f = mt::SafetensorsFile::open(file);
  const mt::Tensor ids = f.tensor("input_ids"), labels = f.tensor("labels");
  const int64_t rows = ids.shape()[0], cols = ids.shape()[1];
  const std::vector<int64_t> all_ids = ids_of(ids), all_labels = ids_of(labels);
  const std::vector<int64_t> all_pos = f.has("position_ids") ? ids_of(f.tensor("position_ids")) : std::vector<int64_t>{};
  std::vector<mixtune::Sequence> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    auto row = [&](const std::vector<int64_t>& v) {
      return v.empty() ? v : std::vector<int64_t>(v.begin() + r * cols, v.begin() + (r + 1) * cols);
    };
    out[static_cast<size_t>(r)] = {row(all_ids), row(all_labels), row(all_pos)};
  }
  return out;
}

void expect_loss_near(const mixtune::ScoreResult& got, const nlohmann::json& want, double rel) {
  for (const char* k : {"loss", "ce_loss", "aux_loss"}) {
    const double w = want[k].get<double>();
    double g = k == std::string("loss") ? got.loss : k == std::string("ce_loss") ? got.ce_loss : got.aux_loss;
    EXPECT_LE(std::abs(g - w), rel * std::abs(w)) << k << " " << g << " vs " << w;
  }
  EXPECT_EQ(got.tokens, want["tokens"].get<int64_t>());
}

// Two documents packed in one row: position_ids restart at the second, and the loss and logits are Transformers'
// packed-sequence forward's (loss rel 1e-5, logits abs 1e-4: the CPU reference's tolerances, docs/numerics.md).
TEST(ModelApi, PackedRowWithPositionIdsMatchesTransformers) {
  const nlohmann::json meta = mt::test::read_json(kFixtures + "qwen3_moe/moe_gqa_aux/meta.json");
  const std::string batch = kFixtures + "qwen3_moe/moe_gqa_aux/packed.safetensors";
  const mixtune::Model m = mixtune::Model::from_pretrained(kBase, {.dtype = "float32"});
  const mixtune::ScoreResult r = m.score(sequences_of(batch), /*want_logits=*/true);
  expect_loss_near(r, meta["batches"]["packed"]["fp32"], 1e-5);
  const mt::SafetensorsFile f = mt::SafetensorsFile::open(batch);
  const mt::Tensor ref = f.tensor("logits");
  ASSERT_EQ(r.logits_shape, ref.shape());
  const float* p = ref.data_as<float>();
  const std::vector<float> want(p, p + ref.numel());
  EXPECT_LE(mt::test::max_abs_diff(r.logits, want), 1e-4);

  // Without the position ids the row is one document: a different loss (the ids are really used).
  std::vector<mixtune::Sequence> one_doc = sequences_of(batch);
  one_doc[0].position_ids.clear();
  EXPECT_GT(std::abs(m.score(one_doc).loss - r.loss), 1e-3);
}

// PEFT's adapter (attention + both expert stacks through target_parameters) on the plain batch: PEFT's loss when
// attached; generate and save_pretrained refuse it unmerged; merged (merge_and_unload), the same loss up to rounding.
TEST(ModelApi, AdapterUnmergedThenMergedMatchesPeft) {
  const std::string fx = kFixtures + "qwen3_moe_lora/attn_experts/";
  const nlohmann::json meta = mt::test::read_json(fx + "meta.json");
  const std::vector<mixtune::Sequence> batch = sequences_of(kFixtures + "qwen3_moe/moe_gqa_aux/plain.safetensors");
  mixtune::Model m = mixtune::Model::from_pretrained(kBase, {.dtype = "float32", .adapter = fx + "adapter"});
  ASSERT_TRUE(m.has_adapter());
  const mixtune::ScoreResult unmerged = m.score(batch);
  expect_loss_near(unmerged, meta["fp32"], 1e-5);

  mt::io_test::ScratchDir dir;
  try {
    m.generate(std::vector<int64_t>{5, 17, 99});
    ADD_FAILURE() << "generate ran with an unmerged adapter";
  } catch (const mixtune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("merge_adapter()"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.save_pretrained(dir.file("refused")), mixtune::Error);
  EXPECT_FALSE(std::filesystem::exists(dir.file("refused")));
  m.save_adapter(dir.file("adapter"));
  EXPECT_TRUE(std::filesystem::exists(dir.file("adapter") + "/adapter_model.safetensors"));

  m.merge_adapter();
  EXPECT_FALSE(m.has_adapter());
  EXPECT_THROW(m.merge_adapter(), mixtune::Error);
  const mixtune::ScoreResult merged = m.score(batch);
  EXPECT_LE(std::abs(merged.loss - unmerged.loss), 1e-5 * std::abs(unmerged.loss));
  EXPECT_EQ(m.generate(std::vector<int64_t>{5, 17, 99}, {.max_new_tokens = 4, .temperature = 0.0}).ids.size(), 4u);

  // The saved adapter attaches to a fresh base and gives the same loss (the same arithmetic).
  const mixtune::Model again = mixtune::Model::from_pretrained(kBase, {.dtype = "float32", .adapter = dir.file("adapter")});
  EXPECT_EQ(again.score(batch).loss, unmerged.loss);
}

TEST(ModelApi, MemoryPlanAddsUpAndRefusesWhatCannotFit) {
  const mixtune::Model m = mixtune::Model::from_pretrained(kBase);
  const mixtune::MemoryPlan p = m.memory_plan({.micro_batch = 2, .seq_len = 1024, .recompute = "none"});
  EXPECT_TRUE(p.fits);
  EXPECT_EQ(p.total, p.params + p.grads + p.optimizer + p.activations + p.workspace);
  EXPECT_GT(p.activations, 0);
  EXPECT_NE(p.table.find("activations"), std::string::npos) << p.table;
  const mixtune::MemoryPlan tiny = m.memory_plan({.seq_len = 1 << 20, .device_bytes = int64_t{2} << 30});
  EXPECT_FALSE(tiny.fits);
  EXPECT_THROW(m.memory_plan({.recompute = "sometimes"}), mixtune::Error);
}

TEST(ModelApi, InspectAndInfoDescribeTheCheckpoint) {
  const mixtune::ModelInfo i = mixtune::Model::inspect(kBase);
  const nlohmann::json config = mt::test::read_json(kBase + "/config.json");
  EXPECT_EQ(i.architecture, "Qwen3MoeForCausalLM");
  EXPECT_EQ(i.model_type, "qwen3_moe");
  EXPECT_EQ(i.layers, config["num_hidden_layers"].get<int64_t>());
  EXPECT_EQ(i.experts, config["num_local_experts"].get<int64_t>());
  EXPECT_EQ(i.experts_per_token, config["num_experts_per_tok"].get<int64_t>());
  EXPECT_GT(i.parameters.total, i.parameters.active_per_token);
  EXPECT_EQ(nlohmann::json::parse(i.json)["parameters"]["total"].get<int64_t>(), i.parameters.total);
  EXPECT_EQ(mixtune::Model::from_pretrained(kBase, {.dtype = "bfloat16"}).info().dtype, "bfloat16");
}

// Every failure reaches the caller as mixtune::Error with the CLI's one line (the internal mt::Error never leaks).
TEST(ModelApi, ErrorsAreOneLineMixtuneErrors) {
  auto message_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const mixtune::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  const std::string missing = message_of([] { mixtune::Model::from_pretrained("/nonexistent/mixtune-model"); });
  EXPECT_NE(missing.find("/nonexistent/mixtune-model"), std::string::npos) << missing;
  EXPECT_EQ(missing.find('\n'), std::string::npos) << missing;
  const std::string dtype = message_of([] { mixtune::Model::from_pretrained(kBase, {.dtype = "float16"}); });
  EXPECT_NE(dtype.find("LoadOptions.dtype"), std::string::npos) << dtype;
  const mixtune::Model m = mixtune::Model::from_pretrained(kBase);
  EXPECT_NE(message_of([&] { m.score({{.input_ids = {1, 2, 100000}}}); }).find("sequences[0].input_ids[2]"),
            std::string::npos);
  EXPECT_NE(message_of([&] { m.score({{.input_ids = {1, 2}, .labels = {1}}}); }).find("labels has 1 entries"),
            std::string::npos);
  EXPECT_NE(message_of([] { mixtune::finetune("/nonexistent/recipe.yaml"); }).find("/nonexistent/recipe.yaml"),
            std::string::npos);
}

TEST(ModelApi, VersionIsTheProjects) {
  EXPECT_EQ(mixtune::version(), MIXTUNE_VERSION_STRING);
  EXPECT_EQ(mixtune::version().rfind(std::to_string(MIXTUNE_VERSION_MAJOR) + ".", 0), 0u);
}

}  // namespace
