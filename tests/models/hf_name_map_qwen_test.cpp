// The Qwen3-MoE and Qwen3 checkpoint layouts (the family file's rule lists) on the Transformers-made fixtures:
// a map built from the rules and a hand-written parameter list agrees byte for byte with ModelWeights::from_hf /
// to_hf and CausalLM's save (which go through the registry's layout over the parameter table).
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>

#include "../io/io_test_util.h"
#include "../train/fixture_tensors.h"
#include "hf_rules_test_util.h"
#include "io/checkpoint_files.h"
#include "models/causal_lm.h"
#include "models/model_weights.h"

namespace mt {
namespace {

using hf_test::bytes_equal;

std::vector<HfParam> qwen_params(const DecoderSpec& cfg, DType dt) {
  std::vector<HfParam> r;
  ModelWeights shapes = ModelWeights::absent_like_config(cfg, dt);
  for (const auto& [name, t] : shapes.named_parameters())
    r.push_back({name, t->shape(), dt, shapes.param_table().is_expert_stack(name)});
  return r;
}

HfNameMap qwen_map(const DecoderSpec& cfg, DType dt) {
  return HfNameMap(hf_test::qwen3_layout(cfg.model_type == "qwen3_moe", cfg.tie_word_embeddings),
                   qwen_params(cfg, dt));
}

const char* const kFixtures[] = {"moe_gqa_aux/ckpt",   "moe_gqa_aux/ckpt_bf16", "moe_mha_tied_sparse2/ckpt",
                                 "moe_mqa_legacy/ckpt", "dense_qwen3/ckpt",      "train5/final"};

std::string fixture_dir(const char* variant) {
  return std::string(MIXTUNE_SOURCE_DIR) + "/tests/fixtures/qwen3_moe/" + variant;
}

// Load through the rules == load through from_hf, tensor by tensor, bitwise (F32 and BF16 targets); save through
// the rules == to_hf: same names, order, bytes, and still views of the parameters.
TEST(HfNameMapQwen, FixturesLoadAndSaveExactlyAsToday) {
  for (const char* variant : kFixtures) {
    SCOPED_TRACE(variant);
    const std::string dir = fixture_dir(variant);
    const DecoderSpec cfg = DecoderSpec::from_file(dir + "/config.json");
    CheckpointFiles files = CheckpointFiles::open(dir);
    for (DType dt : {DType::F32, DType::BF16}) {
      const HfNameMap map = qwen_map(cfg, dt);
      const std::vector<Tensor> got = map.load(hf_checkpoint_of(files));
      ModelWeights want = ModelWeights::from_hf(
          cfg, dt, [&](const std::string& n) { return files.has(n) ? files.tensor(n) : Tensor(); }, files.names(),
          dir);
      const auto named = want.named_parameters();
      ASSERT_EQ(named.size(), got.size());
      for (size_t i = 0; i < named.size(); ++i) {
        EXPECT_EQ(map.params()[i].name, named[i].first);
        EXPECT_TRUE(bytes_equal(got[i], *named[i].second)) << named[i].first;
      }
      const std::vector<std::pair<std::string, Tensor>> today = want.to_hf(cfg);
      const auto saved = map.save(got);
      ASSERT_EQ(saved.size(), today.size());
      for (size_t i = 0; i < saved.size(); ++i) {
        EXPECT_EQ(saved[i].first, today[i].first) << i;
        EXPECT_TRUE(bytes_equal(saved[i].second, today[i].second)) << saved[i].first;
      }
      const auto names = map.saved_names();
      ASSERT_EQ(names.size(), saved.size());
      for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(names[i].first, saved[i].first);
    }
  }
}

// Saved expert tensors are views of the stacked parameter (no copy), as today's to_hf gives.
TEST(HfNameMapQwen, SavedExpertsAreViews) {
  const std::string dir = fixture_dir("moe_gqa_aux/ckpt");
  const DecoderSpec cfg = DecoderSpec::from_file(dir + "/config.json");
  CheckpointFiles files = CheckpointFiles::open(dir);
  const HfNameMap map = qwen_map(cfg, DType::F32);
  const std::vector<Tensor> v = map.load(hf_checkpoint_of(files));
  size_t experts = 0;
  for (const auto& [name, t] : map.save(v)) {
    if (name.find(".mlp.experts.") == std::string::npos) continue;
    ++experts;
    bool shares = false;
    for (const Tensor& p : v) shares = shares || p.storage() == t.storage();
    EXPECT_TRUE(shares) << name;
  }
  EXPECT_GT(experts, 0u);
}

// The whole save, written to disk: the files are byte-identical to CausalLM::save_pretrained's (the `convert`
// round trip), for every fixture.
TEST(HfNameMapQwen, WrittenFilesAreByteIdentical) {
  for (const char* variant : kFixtures) {
    SCOPED_TRACE(variant);
    io_test::ScratchDir tmp;
    const std::string dir = fixture_dir(variant);
    CausalLM model = CausalLM::from_pretrained(dir);
    model.save_pretrained(tmp.file("today"));
    const HfNameMap map = qwen_map(model.config, model.dtype);
    CheckpointFiles files = CheckpointFiles::open(dir);
    const auto tensors = map.save(map.load(hf_checkpoint_of(files)));
    CheckpointWriteOptions wo;  // as CausalLM::save_layout: reuse the source's shards, else save_pretrained's rule
    wo.max_shard_bytes = std::numeric_limits<int64_t>::max();
    if (!model.source_shard_of.empty())
      wo.shard_of = model.source_shard_of;
    else if (auto m = hf_shard_mapping(tensors, map.saved_storage_units(), 50'000'000'000); !m.empty())
      wo.shard_of = m;
    std::filesystem::create_directories(tmp.file("rules"));
    checkpoint_write_tensors(tmp.file("rules"), tensors, wo);
    size_t compared = 0;
    for (const auto& name : io_test::listing(tmp.file("rules"))) {
      EXPECT_EQ(io_test::read_bytes(tmp.file("rules/" + name)), io_test::read_bytes(tmp.file("today/" + name)))
          << name;
      ++compared;
    }
    size_t today = 0;
    for (const auto& name : io_test::listing(tmp.file("today"))) today += name.rfind("model", 0) == 0;
    EXPECT_EQ(compared, today);
  }
}

// A checkpoint saved with save_original_format=False holds the fused v5 tensors: the rules' second alternative
// reads it, as from_hf does.
TEST(HfNameMapQwen, FusedExpertTensorsLoadToo) {
  const std::string dir = fixture_dir("moe_gqa_aux/ckpt");
  const DecoderSpec cfg = DecoderSpec::from_file(dir + "/config.json");
  CheckpointFiles files = CheckpointFiles::open(dir);
  const HfNameMap map = qwen_map(cfg, DType::F32);
  const std::vector<Tensor> v = map.load(hf_checkpoint_of(files));
  hf_test::FakeCheckpoint fused;
  for (size_t i = 0; i < v.size(); ++i) fused.add(map.params()[i].name, v[i].clone());
  const std::vector<Tensor> again = map.load(fused.view());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_TRUE(bytes_equal(again[i], v[i])) << map.params()[i].name;
  // Both forms of one parameter: refused.
  hf_test::FakeCheckpoint both = fused;
  both.add("model.layers.0.mlp.experts.0.down_proj.weight", v[0].clone());
  io_test::expect_error([&] { map.load(both.view()); }, {"two forms of one parameter", "experts.down_proj",
                                                         "experts.0.down_proj.weight"});
}

// An expert-parallel rank's share, read through the rules, equals from_hf's (both layouts: all E rows with only
// the share written, or compact).
TEST(HfNameMapQwen, ExpertShareMatchesFromHf) {
  const std::string dir = fixture_dir("moe_gqa_aux/ckpt");
  const DecoderSpec cfg = DecoderSpec::from_file(dir + "/config.json");
  CheckpointFiles files = CheckpointFiles::open(dir);
  const HfNameMap map = qwen_map(cfg, DType::F32);
  ASSERT_GE(cfg.num_experts(), 3);
  for (bool compact : {false, true}) {
    HfLoadOptions o;
    o.expert_first = 1;
    o.expert_count = 2;
    o.compact_experts = compact;
    const std::vector<Tensor> got = map.load(hf_checkpoint_of(files), o);
    ModelWeights want = ModelWeights::from_hf(
        cfg, DType::F32, [&](const std::string& n) { return files.has(n) ? files.tensor(n) : Tensor(); },
        files.names(), dir, 1, 2, {}, compact);
    const auto named = want.named_parameters();
    for (size_t i = 0; i < named.size(); ++i) {
      ASSERT_EQ(got[i].shape(), named[i].second->shape()) << named[i].first;
      if (!map.params()[i].expert_stack || compact) {
        EXPECT_TRUE(bytes_equal(got[i], *named[i].second)) << named[i].first;
      } else {
        EXPECT_TRUE(bytes_equal(got[i].rows(1, 3), named[i].second->rows(1, 3))) << named[i].first;
      }
    }
    if (compact) {  // a compact rank's save lists every expert, its own as views, the others absent
      const auto mine = map.save(got, 1);
      const auto all = map.save(map.load(hf_checkpoint_of(files)));
      const std::vector<HfSavedSource> sources = map.saved_sources();
      ASSERT_EQ(mine.size(), all.size());
      ASSERT_EQ(sources.size(), all.size());
      for (size_t i = 0; i < all.size(); ++i) {
        EXPECT_EQ(mine[i].first, all[i].first);
        EXPECT_EQ(sources[i].name, all[i].first);
        const int64_t e = sources[i].expert;
        if (e == 0 || e >= 3)
          EXPECT_FALSE(mine[i].second.present()) << all[i].first;
        else
          EXPECT_TRUE(bytes_equal(mine[i].second, all[i].second)) << all[i].first;
      }
    }
  }
}

}  // namespace
}  // namespace mt
